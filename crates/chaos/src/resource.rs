//! The resources the workers write: a Postgres table they write straight through
//! `fenced_transaction`, and an HTTP service behind `FenceLayer` (in the runner's process)
//! whose handler writes through `fenced_transaction` too, plus an advisory route whose
//! token-less writes the audit sink records as unprotected.
//!
//! | resource (history name) | how | seq |
//! |---|---|---|
//! | `pg/<key>` | worker: `fenced_transaction` on `chaos_pg_cell` | the row's `version` after the write |
//! | `/cells/<key>` | `PUT` through `FenceLayer` (fenced), handler: `fenced_transaction` on `chaos_http_cell` | the row's `version` |
//! | `/advisory/<key>` | `PUT` through `FenceLayer` (advisory), plain `UPDATE` of `chaos_advisory` | the row's `version` |
//!
//! HTTP answers: 200 `{"seq": N}`; 409 with `highest` (the layer's problem+json, or the
//! handler's own body when the database refused a token the layer admitted); 503 when
//! the database is unavailable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::put;
use axum::{Extension, Json, Router};
use deadpool_postgres::Pool;
use palisade_audit::{AuditSink, Labels};
use palisade_fence::{
    fenced_transaction, Enforcement, EnforcementTable, FenceError, FenceLayer, MemoryStore,
    VerifiedToken,
};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::error::ChaosError;

/// The name the resource service reports its writes under in the audit trail.
pub const SERVICE_NAME: &str = "chaos-resource";

/// The schema of the resources (idempotent).
pub(crate) const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS chaos_pg_cell (id text PRIMARY KEY, value bigint NOT NULL, version bigint NOT NULL);
    CREATE TABLE IF NOT EXISTS chaos_http_cell (id text PRIMARY KEY, value bigint NOT NULL, version bigint NOT NULL);
    CREATE TABLE IF NOT EXISTS chaos_advisory (id text PRIMARY KEY, version bigint NOT NULL);";

/// The key of lock number `i` (also the row id of its cells).
pub(crate) fn key_name(i: u32) -> String {
    format!("key-{i}")
}

/// Creates the tables and one row per key in each, and the fence's and audit's schemas.
pub(crate) async fn prepare(pool: &Pool, keys: u32) -> Result<(), ChaosError> {
    palisade_audit::migrate(pool).await?;
    let mut client = pool
        .get()
        .await
        .map_err(|e| ChaosError::NotReady(format!("the resource database ({e})")))?;
    palisade_fence::migrate(&mut **client)
        .await
        .map_err(|e| ChaosError::NotReady(format!("the fence schema ({e})")))?;
    client
        .batch_execute(SCHEMA)
        .await
        .map_err(ChaosError::pg("creating the resource tables"))?;
    for i in 0..keys {
        let id = key_name(i);
        for table in ["chaos_pg_cell", "chaos_http_cell"] {
            client
                .execute(&format!("INSERT INTO {table} (id, value, version) VALUES ($1, 0, 0) ON CONFLICT DO NOTHING"), &[&id])
                .await
                .map_err(ChaosError::pg("inserting the resource rows"))?;
        }
        client
            .execute(
                "INSERT INTO chaos_advisory (id, version) VALUES ($1, 0) ON CONFLICT DO NOTHING",
                &[&id],
            )
            .await
            .map_err(ChaosError::pg("inserting the advisory rows"))?;
    }
    Ok(())
}

/// The running HTTP resource service.
pub(crate) struct ResourceService {
    /// `http://IP:PORT`.
    pub(crate) url: String,
    sink: AuditSink,
    task: JoinHandle<()>,
}

impl ResourceService {
    /// Starts the service on `ip` (the resource host's address, or loopback) and a free
    /// port; its audit sink spools to `spool`.
    pub(crate) async fn start(
        pool: Pool,
        spool: PathBuf,
        ip: std::net::IpAddr,
    ) -> Result<ResourceService, ChaosError> {
        let sink = AuditSink::builder(SERVICE_NAME, spool)
            .flush_interval(Duration::from_millis(100))
            .classify(|resource| {
                if resource.starts_with("/advisory/") {
                    Labels::new("chaos", "advisory")
                } else {
                    Labels::new("chaos", "cells")
                }
            })
            .start(pool.clone());
        // One process serves the resource, so an in-process store holds the marks; the
        // handler's transaction orders the writes themselves.
        let fence = FenceLayer::new(MemoryStore::new(100_000))
            .with_enforcement_table(
                EnforcementTable::new(Enforcement::Fenced)
                    .with_prefix("/advisory/", Enforcement::Advisory),
            )
            .with_observer(sink.observer())
            .with_caller(|headers, _| {
                headers
                    .get("x-caller")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            });
        let app = Router::new()
            .route("/cells/{id}", put(write_cell))
            .route("/advisory/{id}", put(write_advisory))
            .route_layer(fence)
            .with_state(pool);
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(ChaosError::io("binding the resource service"))?;
        let addr = listener
            .local_addr()
            .map_err(ChaosError::io("the resource service's address"))?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the resource service stopped");
            }
        });
        Ok(ResourceService {
            url: format!("http://{addr}"),
            sink,
            task,
        })
    }

    /// Stops serving and flushes the audit sink; returns how many events it dropped.
    pub(crate) async fn stop(self) -> u64 {
        self.task.abort();
        let stats = self.sink.shutdown().await;
        stats.dropped
    }
}

type Answer = (StatusCode, Json<Value>);

fn unavailable(e: impl std::fmt::Display) -> Answer {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "error": e.to_string() })),
    )
}

/// A fenced read-modify-write of one cell; the layer has admitted `verified`.
async fn write_cell(
    State(pool): State<Pool>,
    Extension(verified): Extension<VerifiedToken>,
    Path(id): Path<String>,
) -> Answer {
    let mut client = match pool.get().await {
        Ok(c) => c,
        Err(e) => return unavailable(e),
    };
    let result = fenced_transaction(&mut client, &verified.resource, verified.token, |tx| {
        Box::pin(async move {
            let value: i64 = tx.query_one("SELECT value FROM chaos_http_cell WHERE id = $1", &[&id]).await?.get(0);
            let version: i64 = tx
                .query_one(
                    "UPDATE chaos_http_cell SET value = $2, version = version + 1 WHERE id = $1 RETURNING version",
                    &[&id, &(value + 1)],
                )
                .await?
                .get(0);
            Ok::<_, FenceError>(version)
        })
    })
    .await;
    match result {
        Ok(version) => (StatusCode::OK, Json(json!({ "seq": version }))),
        Err(e) if e.is_stale() => (
            StatusCode::CONFLICT,
            Json(
                json!({ "error": e.to_string(), "highest": e.highest().map(|h| h.get().to_string()) }),
            ),
        ),
        Err(e) => unavailable(e),
    }
}

/// An advisory write: no token needed (the layer reported it if it had none).
async fn write_advisory(State(pool): State<Pool>, Path(id): Path<String>) -> Answer {
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) => return unavailable(e),
    };
    match client
        .query_one(
            "UPDATE chaos_advisory SET version = version + 1 WHERE id = $1 RETURNING version",
            &[&id],
        )
        .await
    {
        Ok(row) => (StatusCode::OK, Json(json!({ "seq": row.get::<_, i64>(0) }))),
        Err(e) => unavailable(e),
    }
}
