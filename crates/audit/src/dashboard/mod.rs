//! The audit dashboard: axum pages and JSON over the audit tables.
//!
//! [`router`] (or [`router_with_live`], with etcd) serves (all `GET`):
//!
//! | path | what |
//! |---|---|
//! | `/` | the overview: unprotected writes in the range, the last 24 h and 7 days and the trend against the 7 days before; refused writes by reason; holds and waiters now (with etcd); audit gaps; dropped write events; the top callers, services and resources writing unprotected (each linking to its rows); the hours stacked by finding |
//! | `/unprotected` | unprotected writes, newest first, 50 a page (`limit` up to 500), with the hourly chart |
//! | `/unprotected.csv` | the filtered rows as CSV (at most 100,000) |
//! | `/unprotected/chart.svg` | the hourly chart alone |
//! | `/refused` | the writes the fence layer refused (428, 400, 409, 503), with the refused token and, when stale, the resource's mark |
//! | `/locks?key=K` | a lock's timeline: `K` is `ns/class/key` or the key alone; grants, releases, expiries, forces with the time each was recorded, the etcd cluster and the namespace's tier, and the audit gaps of the lock's clusters where they cut the history (all gaps when the lock has no event); the field offers the most recently granted locks |
//! | `/force-releases` | forced releases with reason, requester and approver; mark resets with the lock they were checked against (or "lock unknown") and the database role |
//! | `/metrics` | Prometheus gauges: `palisade_audit_gaps`, and with etcd `palisade_audit_tailer_behind_revisions` (the newest lock-key change etcd holds minus the tailer's position) |
//! | `/api/overview`, `/api/unprotected`, `/api/unprotected/hourly`, `/api/refused`, `/api/locks?key=K`, `/api/force-releases` | the same as JSON |
//!
//! Filters of the write views (query string, all optional, exact match):
//! `namespace`, `class`, `resource`, `service`, `caller`, `finding` (`missing_token`,
//! `malformed_token`, `stale`, `store_unavailable`), and the time range shared by every
//! page: `range` (`1h`, `6h`, `24h`, `7d`, `14d`: that long up to now, or up to `to`) or
//! `from` / `to` (UTC, RFC 3339 like `2026-11-30T10:00:00Z`, or `2026-11-30T10:00`;
//! `from` inclusive, `to` exclusive; `from` wins over `range`). Every page shows the
//! range picker and its links keep the range. Without a range the write tables show every
//! row, and the charts and the overview the last 24 hours (two weeks at most); the forced
//! releases take the range too, a lock's timeline shows its whole history. Pages are
//! keyset-paginated: `before` is the `next` cursor of the previous page. Tokens are JSON
//! strings (they exceed 2^53); times are RFC 3339 strings.
//!
//! etcd history has no timestamps: a timeline event's time is when the tailer stored it.
//! The tier is the namespace's `cluster_tier` as its config record in etcd holds it now
//! (a namespace has one tier; events carry the id of the etcd cluster they came from).
//!
//! Text filters are trimmed, then checked by `palisade_api::validate_text` (no control
//! character, NUL included, and no bidirectional formatting character; at most 2048 bytes), and `key` as a lock key
//! (`palisade_api::validate_key`: no control character, at most 512 bytes).
//!
//! Who may ask: [`Access::protect`] puts a router behind a `Host` allow-list (by default
//! the address it listens on, and loopback names for a loopback bind: 403 `forbidden`
//! otherwise, against DNS rebinding) and, optionally, a bearer token
//! (401 `unauthenticated` without it). `palisade audit serve` always applies it
//! (`--allow-host`, `--token-file`).
//!
//! Everything is rendered server-side with maud, which escapes every value; pages load
//! nothing from elsewhere (inline CSS, inline SVG, no scripts). A bad filter or key is a
//! 400 naming the parameter and the cause, an unreachable database a 503, as plain text.

mod access;
mod api;
mod csv;
mod home;
mod live;
mod overview;
mod pages;
mod query;
mod timeline;

pub(crate) mod chart;

use axum::extract::FromRef;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use deadpool_postgres::Pool;

pub use access::{Access, AccessError};
pub use live::Live;

use crate::AuditError;

/// The dashboard's routes over the audit database behind `pool` (see the module docs).
/// Holds and waiters now, and the tiers of the timeline, need etcd:
/// [`router_with_live`].
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = palisade_audit::pool("host=127.0.0.1 user=postgres dbname=audit", 4)?;
/// palisade_audit::migrate(&pool).await?;
/// let app = palisade_audit::dashboard::router(pool);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await?;
/// # Ok(()) }
/// ```
pub fn router(pool: Pool) -> Router {
    routes(Dash { pool, live: None })
}

/// [`router`], with etcd for what only etcd knows now: the overview's holds and waiters
/// and the timeline's tiers (each namespace's `cluster_tier`). When etcd does not answer,
/// those show as unknown; the rest of the pages do not depend on it.
pub fn router_with_live(pool: Pool, live: Live) -> Router {
    routes(Dash {
        pool,
        live: Some(live),
    })
}

fn routes(dash: Dash) -> Router {
    Router::new()
        .route("/", get(home::page))
        .route("/unprotected", get(pages::unprotected))
        .route("/unprotected.csv", get(csv::unprotected))
        .route("/unprotected/chart.svg", get(pages::chart))
        .route("/refused", get(pages::refused))
        .route("/locks", get(pages::locks))
        .route("/force-releases", get(pages::force_releases))
        .route("/api/overview", get(home::api))
        .route("/api/unprotected", get(api::unprotected))
        .route("/api/unprotected/hourly", get(api::hourly))
        .route("/api/refused", get(api::refused))
        .route("/api/locks", get(api::locks))
        .route("/api/force-releases", get(api::force_releases))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn(utf8_query))
        .with_state(dash)
}

/// Refuses a query string with a parameter that is not UTF-8 once percent-decoded (400,
/// naming it), which the handlers' `Query` would read with U+FFFD in its place: a filter
/// or a lock key other than the one asked for.
async fn utf8_query(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<Response, DashError> {
    palisade_api::validate_query_utf8(req.uri().query().unwrap_or_default())
        .map_err(query::FilterError::from)?;
    Ok(next.run(req).await)
}

/// The handlers' state: the audit database, and etcd when given.
#[derive(Clone)]
struct Dash {
    pool: Pool,
    live: Option<Live>,
}

impl FromRef<Dash> for Pool {
    fn from_ref(dash: &Dash) -> Pool {
        dash.pool.clone()
    }
}

impl Dash {
    /// Holds and waiters now; `None` without etcd or when it fails (logged).
    async fn now(&self) -> Option<live::Now> {
        let live = self.live.as_ref()?;
        live.now()
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "dashboard: etcd did not answer"))
            .ok()
    }

    /// Each namespace's tier; `None` without etcd or when it fails (logged).
    async fn tiers(&self) -> Option<std::collections::HashMap<String, String>> {
        let live = self.live.as_ref()?;
        live.tiers()
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "dashboard: etcd did not answer"))
            .ok()
    }
}

/// `GET /metrics`: the audit trail's gauges in Prometheus text format (0.0.4).
///
/// - `palisade_audit_tailer_behind_revisions` (with etcd only): how many revisions the
///   newest lock-key change etcd holds is past the tailer's stored position; stays above
///   0 while the tailer is down or falling behind. Absent without etcd or when etcd
///   does not answer.
/// - `palisade_audit_gaps`: audit gap rows ever recorded.
async fn metrics(
    axum::extract::State(dash): axum::extract::State<Dash>,
) -> Result<String, DashError> {
    let client = dash.pool.get().await?;
    let gaps: i64 = client
        .query_one("SELECT count(*) FROM audit_event WHERE type = 'gap'", &[])
        .await
        .map_err(AuditError::from)?
        .get(0);
    let registry = prometheus::Registry::new();
    let gauge = |name: &str, help: &str, value: i64| {
        let g = prometheus::IntGauge::new(name, help).expect("valid metric");
        g.set(value);
        registry.register(Box::new(g)).expect("registered once");
    };
    gauge(
        "palisade_audit_gaps",
        "Audit gap rows ever recorded (etcd history compacted before the tailer read it).",
        gaps,
    );
    if let Some(live) = &dash.live {
        match live.tailer_behind(&**client).await {
            Ok(behind) => gauge(
                "palisade_audit_tailer_behind_revisions",
                "Revisions the newest lock-key change in etcd is past the tailer's position.",
                behind.min(i64::MAX as u64) as i64,
            ),
            Err(e) => tracing::warn!(error = %e, "dashboard: etcd did not answer"),
        }
    }
    Ok(prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap_or_default())
}

/// Why a dashboard request failed.
#[derive(Debug, thiserror::Error)]
enum DashError {
    #[error("bad query: {0}")]
    Filter(#[from] query::FilterError),
    #[error("{0}")]
    Audit(#[from] AuditError),
    #[error("csv: {0}")]
    Csv(#[from] ::csv::Error),
}

impl From<deadpool_postgres::PoolError> for DashError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        DashError::Audit(e.into())
    }
}

impl IntoResponse for DashError {
    fn into_response(self) -> Response {
        let status = match &self {
            DashError::Filter(_) => StatusCode::BAD_REQUEST,
            DashError::Audit(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            DashError::Audit(_) | DashError::Csv(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::warn!(error = %self, "dashboard request failed");
        }
        (status, self.to_string()).into_response()
    }
}

/// The chart's window for these filters: `from`..`to`, by default the last 24 hours.
fn chart_window(filter: &query::Filter) -> (std::time::SystemTime, std::time::SystemTime) {
    let day = std::time::Duration::from_secs(24 * 3600);
    let to = filter.to.unwrap_or_else(std::time::SystemTime::now);
    let from = filter.from.unwrap_or(to - day);
    let longest = std::time::Duration::from_secs(query::CHART_MAX_HOURS * 3600);
    let from = if to.duration_since(from).is_ok_and(|d| d > longest) {
        to - longest
    } else {
        from
    };
    (from, to)
}

/// RFC 3339, seconds, UTC.
fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The caption naming the active filters.
fn caption(filter: &query::Filter) -> String {
    let mut parts = Vec::new();
    for (name, v) in filter.text_fields() {
        if let Some(v) = v {
            parts.push(format!("{name} {v}"));
        }
    }
    if parts.is_empty() {
        "Unprotected writes per hour".to_owned()
    } else {
        format!("Unprotected writes per hour, {}", parts.join(", "))
    }
}
