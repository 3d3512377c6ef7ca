//! The audit dashboard: axum pages and JSON over the audit tables.
//!
//! [`router`] serves (all `GET`):
//!
//! | path | what |
//! |---|---|
//! | `/` | redirects to `/unprotected` |
//! | `/unprotected` | unprotected writes, newest first, 50 a page (`limit` up to 500), with the hourly chart |
//! | `/unprotected.csv` | the filtered rows as CSV (at most 100,000) |
//! | `/unprotected/chart.svg` | the hourly chart alone |
//! | `/locks?key=K` | the timeline of lock key `K`: grants, releases, expiries, forces, gaps, with tokens |
//! | `/force-releases` | forced releases with reason, requester and approver |
//! | `/api/unprotected`, `/api/unprotected/hourly`, `/api/locks?key=K`, `/api/force-releases` | the same as JSON |
//!
//! Filters of the unprotected-writes views (query string, all optional, exact match):
//! `namespace`, `class`, `resource`, `service`, `caller`, and `from` / `to` (UTC,
//! RFC 3339 like `2026-11-30T10:00:00Z`, or `2026-11-30T10:00`; `from` inclusive, `to`
//! exclusive). Pages are keyset-paginated: `before` is the `next` cursor of the previous
//! page. The chart covers `from`..`to`, by default the last 24 hours (two weeks at most).
//! Tokens are JSON strings (they exceed 2^53); times are RFC 3339 strings.
//!
//! Text filters are trimmed, then checked by `palisade_api::validate_text` (no control
//! character, NUL included; at most 2048 bytes), and `key` as a lock key
//! (`palisade_api::validate_key`: no control character, at most 512 bytes).
//!
//! Everything is rendered server-side with maud, which escapes every value; pages load
//! nothing from elsewhere (inline CSS, inline SVG, no scripts). A bad filter or key is a
//! 400 naming the parameter and the cause, an unreachable database a 503, as plain text.

mod api;
mod csv;
mod pages;
mod query;

pub(crate) mod chart;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use deadpool_postgres::Pool;

use crate::AuditError;

/// The dashboard's routes over the audit database behind `pool` (see the module docs).
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
    Router::new()
        .route("/", get(|| async { Redirect::to("/unprotected") }))
        .route("/unprotected", get(pages::unprotected))
        .route("/unprotected.csv", get(csv::unprotected))
        .route("/unprotected/chart.svg", get(pages::chart))
        .route("/locks", get(pages::locks))
        .route("/force-releases", get(pages::force_releases))
        .route("/api/unprotected", get(api::unprotected))
        .route("/api/unprotected/hourly", get(api::hourly))
        .route("/api/locks", get(api::locks))
        .route("/api/force-releases", get(api::force_releases))
        .with_state(pool)
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
