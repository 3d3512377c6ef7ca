//! A worker's writes: a fenced read-modify-write of a PostgreSQL row and a PUT to the
//! HTTP resource, each recorded as invoked (unless the hold's loss was recorded) and
//! completed.

use bytes::Bytes;
use deadpool_postgres::Pool;
use http_body_util::{BodyExt, Full};
use palisade_fence::{fenced_transaction, FenceError, FencingToken};
use tower::{Service, ServiceExt};

use super::{Current, Recorder, WRITE_TIMEOUT};
use crate::history::{Event, Target, WriteOutcome};

/// A fenced read-modify-write of the key's row, unless the hold's loss was recorded.
pub(super) async fn write_pg(
    rec: &Recorder,
    current: &Current,
    pool: &Pool,
    key: &str,
    token: FencingToken,
    op: u64,
) {
    let resource = format!("pg/{key}");
    let invoked = Event::WriteInvoked {
        resource: resource.clone(),
        target: Target::Postgres,
        token: Some(token.get()),
        op,
    };
    if !rec.record_if_held(current, token.get(), invoked) {
        return;
    }
    let outcome = match tokio::time::timeout(WRITE_TIMEOUT, pool.get()).await {
        Ok(Ok(mut client)) => {
            let id = key.to_owned();
            let result = fenced_transaction(&mut client, &resource, token, |tx| {
                Box::pin(async move {
                    let value: i64 = tx
                        .query_one("SELECT value FROM chaos_pg_cell WHERE id = $1", &[&id])
                        .await?
                        .get(0);
                    let version: i64 = tx
                        .query_one(
                            "UPDATE chaos_pg_cell SET value = $2, version = version + 1 WHERE id = $1 RETURNING version",
                            &[&id, &(value + 1)],
                        )
                        .await?
                        .get(0);
                    Ok::<_, FenceError>(version)
                })
            });
            match tokio::time::timeout(WRITE_TIMEOUT, result).await {
                Ok(Ok(version)) => WriteOutcome::Committed {
                    seq: version.max(0) as u64,
                },
                Ok(Err(e)) if e.is_stale() => WriteOutcome::Rejected {
                    highest: e.highest().map(FencingToken::get),
                },
                Ok(Err(e)) => WriteOutcome::Indeterminate {
                    reason: e.to_string(),
                },
                Err(_) => WriteOutcome::Indeterminate {
                    reason: "no answer in time".into(),
                },
            }
        }
        Ok(Err(e)) => WriteOutcome::Indeterminate {
            reason: format!("no connection: {e}"),
        },
        Err(_) => WriteOutcome::Indeterminate {
            reason: "no connection in time".into(),
        },
    };
    rec.record(Event::WriteCompleted {
        resource,
        target: Target::Postgres,
        token: Some(token.get()),
        op,
        outcome,
    });
}

/// A PUT to the resource service, with the hold's token unless the hold's loss was
/// recorded (then nothing is sent); without a token, always.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_http<S>(
    rec: &Recorder,
    current: &Current,
    http: &S,
    base: &str,
    path: &str,
    token: Option<FencingToken>,
    op: u64,
) where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<hyper::body::Incoming>>
        + Clone,
    S::Error: std::fmt::Display,
{
    let token = token.map(FencingToken::get);
    let invoked = Event::WriteInvoked {
        resource: path.to_owned(),
        target: Target::Http,
        token,
        op,
    };
    match token {
        Some(t) => {
            if !rec.record_if_held(current, t, invoked) {
                return;
            }
        }
        None => rec.record(invoked),
    }
    let outcome =
        match tokio::time::timeout(WRITE_TIMEOUT, send(http, base, path, rec.worker)).await {
            Ok(Ok((200, body))) => match body["seq"].as_u64() {
                Some(seq) => WriteOutcome::Committed { seq },
                None => WriteOutcome::Indeterminate {
                    reason: format!("200 without a seq: {body}"),
                },
            },
            Ok(Ok((409, body))) => WriteOutcome::Rejected {
                highest: number(&body["highest"]),
            },
            Ok(Ok((status, body))) => WriteOutcome::Indeterminate {
                reason: format!("HTTP {status}: {body}"),
            },
            Ok(Err(e)) => WriteOutcome::Indeterminate { reason: e },
            Err(_) => WriteOutcome::Indeterminate {
                reason: "no answer in time".into(),
            },
        };
    rec.record(Event::WriteCompleted {
        resource: path.to_owned(),
        target: Target::Http,
        token,
        op,
        outcome,
    });
}

/// A JSON number, or a decimal string (how problem+json carries tokens).
fn number(v: &serde_json::Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

async fn send<S>(
    http: &S,
    base: &str,
    path: &str,
    worker: u32,
) -> Result<(u16, serde_json::Value), String>
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<hyper::body::Incoming>>
        + Clone,
    S::Error: std::fmt::Display,
{
    let req = http::Request::put(format!("{base}{path}"))
        .header("x-caller", format!("spiffe://chaos/workers/w{worker}"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let mut svc = http.clone();
    let resp = svc
        .ready()
        .await
        .map_err(|e| e.to_string())?
        .call(req)
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}
