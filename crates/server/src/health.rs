//! `GET /livez` and `GET /readyz`: probes for supervisors and load balancers. They
//! answer without a caller identity (also over mTLS to a connection without a client
//! certificate, as a kubelet's probe is), in plain text, and are not part of `/v1`.
//!
//! - `/livez`: 200 `ok` while the process serves requests.
//! - `/readyz`: 200 `ready` only while grants can be made: the locker's epoch records
//!   agree with each other and with etcd, and etcd answers a linearizable read within
//!   [`READY_TIMEOUT`]. Otherwise 503 with the reason on one line.

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use palisade_lock::Locker;

/// How long `/readyz` waits for etcd.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The path of the liveness probe.
pub const LIVEZ: &str = "/livez";
/// The path of the readiness probe.
pub const READYZ: &str = "/readyz";

/// The two probes over `locker`.
pub(crate) fn router(locker: Locker) -> Router {
    Router::new().route(LIVEZ, get(|| async { "ok\n" })).route(
        READYZ,
        get(move || {
            let locker = locker.clone();
            async move {
                match not_ready(&locker).await {
                    None => (StatusCode::OK, "ready\n".to_owned()),
                    Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                }
            }
        }),
    )
}

/// Why `locker` cannot grant now, or `None` if it can.
pub async fn not_ready(locker: &Locker) -> Option<String> {
    if let (_, Some(mismatch)) = locker.epoch() {
        return Some(format!(
            "not ready: grants are refused until the epoch is advanced: {mismatch}"
        ));
    }
    // One read of a namespace key: linearizable, so it needs an etcd leader.
    match tokio::time::timeout(READY_TIMEOUT, locker.config().namespace("readyz")).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            let cause = std::error::Error::source(&e)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            Some(format!("not ready: etcd did not answer: {e}{cause}"))
        }
        Err(_) => Some(format!(
            "not ready: etcd did not answer within {} s",
            READY_TIMEOUT.as_secs()
        )),
    }
}
