//! A resource service that refuses stale writers: axum + `FenceLayer` + `PostgresStore`,
//! with the write itself done through `fenced_transaction`, and advisory routes whose
//! token-less writes are reported to the audit trail.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres demo          # the database must exist
//! cargo run --example protected_service -- --listen 127.0.0.1:8081 \
//!     --database "host=127.0.0.1 user=postgres dbname=demo"
//! # a fenced write, with the token of a real hold (a made-up token would raise the
//! # resource's mark above every token the lock service issues):
//! TOKEN=$(palisade lock acquire orders/invoices/invoice-42 | jq -r .token)
//! curl -X PUT -H "Fencing-Token: $TOKEN" -d 'paid' http://127.0.0.1:8081/orders/invoice-42
//! # an advisory write (legacy code without a token): admitted, recorded as unprotected:
//! curl -X PUT -d 'total=12' http://127.0.0.1:8081/legacy/report-7
//! ```
//!
//! Routes (both under `route_layer`, so paths that match no route never create marks):
//!
//! - `PUT /orders/{id}`: **fenced**. No token is 428, a stale one 409 (the handler never
//!   runs). An admitted request carries a `VerifiedToken`; the handler repeats the check
//!   inside the write's transaction, which is what orders the writes themselves.
//! - `PUT /legacy/{id}`: **advisory**. Every write goes through; writes without a current
//!   token are recorded as unprotected (`write_event` table, audit dashboard).
//!
//! - `GET /metrics`: the fence layer's counters in Prometheus text format
//!   (`palisade_fence_admitted_total`, `palisade_fence_refused_total{reason}`,
//!   `palisade_fence_unprotected_total{finding}`).
//!
//! With `--advisory` every route is advisory (a service still migrating to tokens).
//!
//! It prints `listening on http://ADDR` once ready, and stops on Ctrl-C or SIGTERM after
//! flushing its audit events.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Extension, Router};
use clap::Parser;
use palisade_audit::{AuditSink, Labels};
use palisade_fence::{
    fenced_transaction, Enforcement, EnforcementTable, FenceError, FenceLayer, FenceMetrics,
    PostgresStore, VerifiedToken,
};

/// Command-line flags.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The database holding the data, the high-water marks and the audit trail.
    #[arg(long)]
    database: String,
    /// The name this service reports its writes under.
    #[arg(long, default_value = "orders-api")]
    name: String,
    /// Make every route advisory.
    #[arg(long)]
    advisory: bool,
    /// Where audit events wait while the database is unreachable.
    #[arg(long, default_value = "audit-spool.jsonl")]
    spool: PathBuf,
}

type Pool = deadpool_postgres::Pool;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protected_service: {}", with_causes(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes, e.g. the database server's own message.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    // One pool for the handlers and the audit sink; one dedicated connection for the
    // layer's high-water store.
    let database =
        |e: &dyn std::error::Error| format!("database {:?}: {}", args.database, with_causes(e));
    let pool = palisade_audit::pool(&args.database, 8).map_err(|e| database(&e))?;
    palisade_audit::migrate(&pool)
        .await
        .map_err(|e| database(&e))?;
    let (store_client, connection) = tokio_postgres::connect(&args.database, tokio_postgres::NoTls)
        .await
        .map_err(|e| database(&e))?;
    tokio::spawn(connection);
    let mut setup = pool.get().await?;
    palisade_fence::migrate(&mut **setup).await?; // creates fence_high_water and fence_raise
    setup
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS invoice (id text PRIMARY KEY, body text NOT NULL, \
             token bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS legacy_report (id text PRIMARY KEY, body text NOT NULL)",
        )
        .await?;
    drop(setup);

    // Audit: batched, never blocks a request. `classify` labels each resource with the
    // lock namespace and class that should protect it.
    let sink = AuditSink::builder(args.name.clone(), args.spool)
        .flush_interval(Duration::from_millis(100))
        .classify(|resource| {
            if resource.starts_with("/orders/") {
                Labels::new("orders", "invoices")
            } else {
                Labels::new("legacy", "reports")
            }
        })
        .start(pool.clone());

    let default = if args.advisory {
        Enforcement::Advisory
    } else {
        Enforcement::Fenced
    };
    let fence = FenceLayer::new(PostgresStore::new(Arc::new(store_client)))
        .with_enforcement_table(
            EnforcementTable::new(default).with_prefix("/legacy/", Enforcement::Advisory),
        )
        .with_observer(sink.observer())
        .with_fenced_events() // also record admitted and refused fenced writes
        // INSECURE, for the demo: the caller names itself in a header. In production take it
        // from the mTLS peer or a trusted proxy (palisade_audit::CallerIdentity).
        .with_caller(|headers, _| {
            headers
                .get("x-caller")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });

    let metrics = FenceMetrics::new();
    let fence = fence.with_metrics(&metrics);
    let app = Router::new()
        .route("/orders/{id}", put(write_invoice))
        .route("/legacy/{id}", put(write_report))
        .route_layer(fence)
        .with_state(pool)
        // Outside the fence layer: scraping is no write.
        .route("/metrics", get(move || async move { metrics.render() }));

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await?;
    let stats = sink.shutdown().await; // flush what is queued
    eprintln!("audit sink: {stats:?}");
    Ok(())
}

/// A fenced write. The layer admitted the token (it was not below the mark when checked);
/// `fenced_transaction` checks it again while holding the resource's lock, so a writer
/// admitted earlier with a lower token can no longer commit over this one.
async fn write_invoice(
    State(pool): State<Pool>,
    Extension(verified): Extension<VerifiedToken>,
    Path(id): Path<String>,
    body: String,
) -> (StatusCode, String) {
    if let Some(refused) = refuse_id(&id) {
        return refused;
    }
    let mut client = match pool.get().await {
        Ok(c) => c,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let token = verified.token;
    let result = fenced_transaction(&mut client, &verified.resource, token, |tx| {
        Box::pin(async move {
            tx.execute(
                "INSERT INTO invoice (id, body, token) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET body = $2, token = $3, written_at = now()",
                &[&id, &body, &token],
            )
            .await?;
            Ok::<_, FenceError>(())
        })
    })
    .await;
    match result {
        Ok(()) => (StatusCode::OK, format!("written under token {token}\n")),
        Err(e) if e.is_stale() => (
            StatusCode::CONFLICT,
            format!("refused by the database: {e}\n"),
        ),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// An advisory write: no token needed; the layer has already reported it.
async fn write_report(
    State(pool): State<Pool>,
    Path(id): Path<String>,
    body: String,
) -> (StatusCode, String) {
    if let Some(refused) = refuse_id(&id) {
        return refused;
    }
    let result = async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        client
            .execute(
                "INSERT INTO legacy_report (id, body) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET body = $2",
                &[&id, &body],
            )
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    match result {
        Ok(_) => (StatusCode::OK, "written (advisory)\n".to_owned()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// A 400 for an id this service does not store: one with a control character (a path's
/// `%00` decodes to NUL, which Postgres `text` cannot hold). The client's mistake, not the
/// database's failure. On a fenced route the layer has admitted the token by then, which
/// raised the mark to a token its holder holds: that refuses only older holders.
fn refuse_id(id: &str) -> Option<(StatusCode, String)> {
    id.chars().any(char::is_control).then(|| {
        (
            StatusCode::BAD_REQUEST,
            format!("id {id:?} holds a control character\n"),
        )
    })
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
