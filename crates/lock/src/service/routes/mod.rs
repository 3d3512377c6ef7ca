//! The handlers and the route table. Each handler checks input and authorization before
//! it talks to etcd. The router is built from [`table`] only, and the OpenAPI document
//! from the same handlers' `utoipa::path` attributes; a test checks the two agree.

mod admin;
mod extract;
mod force;
#[cfg(feature = "fuzzing")]
pub(super) mod fuzzing;
mod locks;
mod sessions;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Router;
use utoipa::OpenApi;

use super::authz::Authz;
use super::force::ForceReleases;
use super::identity::Caller;
use super::openapi::Finish;
use super::problem::{Problem, ProblemKind};
use super::ServiceOptions;
use crate::detached::SessionRecord;
use crate::locker::Locker;
use crate::model::LeaseId;

#[derive(Clone)]
pub(crate) struct AppState {
    locker: Locker,
    authz: Authz,
    pub(crate) dev_identity: bool,
    max_wait: Duration,
    max_ttl: Duration,
    force: Option<ForceReleases>,
    rates: Arc<super::rate::RateLimits>,
    metrics: super::metrics::Metrics,
    openapi: Arc<String>,
}

/// One route: method, full path (axum syntax, `{param}`), handler.
struct Route {
    method: Method,
    path: &'static str,
    handler: MethodRouter<AppState>,
}

fn route(method: Method, path: &'static str, handler: MethodRouter<AppState>) -> Route {
    Route {
        method,
        path,
        handler,
    }
}

/// Every route the service serves. The router is built from this table only.
fn table() -> Vec<Route> {
    vec![
        route(Method::POST, "/v1/sessions", post(sessions::open_session)),
        route(
            Method::POST,
            "/v1/sessions/{session}/keepalive",
            post(sessions::keepalive),
        ),
        route(
            Method::DELETE,
            "/v1/sessions/{session}",
            delete(sessions::close_session),
        ),
        route(Method::POST, "/v1/locks/acquire", post(locks::acquire)),
        route(Method::POST, "/v1/locks/release", post(locks::release)),
        route(Method::GET, "/v1/locks/status", get(locks::status)),
        route(Method::GET, "/v1/namespaces", get(admin::list_namespaces)),
        route(
            Method::PUT,
            "/v1/namespaces/{ns}",
            put(admin::put_namespace),
        ),
        route(
            Method::GET,
            "/v1/namespaces/{ns}/classes",
            get(admin::list_classes),
        ),
        route(
            Method::PUT,
            "/v1/namespaces/{ns}/classes/{class}",
            put(admin::put_class),
        ),
        route(Method::GET, "/v1/epoch", get(admin::show_epoch)),
        route(
            Method::POST,
            "/v1/epoch/advance",
            post(admin::advance_epoch),
        ),
        route(
            Method::POST,
            "/v1/force-releases",
            post(force::request_force_release),
        ),
        route(
            Method::POST,
            "/v1/force-releases/{id}/approve",
            post(force::approve_force_release),
        ),
        route(Method::GET, "/v1/openapi.json", get(openapi_json)),
        route(Method::GET, "/metrics", get(metrics_text)),
    ]
}

/// `(method, path)` of every route, in the route table's order.
pub(super) fn routes() -> Vec<(Method, &'static str)> {
    table().into_iter().map(|r| (r.method, r.path)).collect()
}

/// The OpenAPI document, from the handlers' `utoipa::path` attributes.
#[derive(OpenApi)]
#[openapi(
    info(title = "Palisade lock service", description = "Locks on etcd with fencing tokens. \
        Errors are application/problem+json (RFC 9457) with a stable `type` \
        `urn:palisade:problem:<slug>`."),
    paths(
        sessions::open_session,
        sessions::keepalive,
        sessions::close_session,
        locks::acquire,
        locks::release,
        locks::status,
        admin::list_namespaces,
        admin::put_namespace,
        admin::list_classes,
        admin::put_class,
        admin::show_epoch,
        admin::advance_epoch,
        force::request_force_release,
        force::approve_force_release,
        openapi_json,
        metrics_text,
    ),
    modifiers(&Finish),
)]
struct ApiDoc;

/// The OpenAPI 3.1 document of the service.
pub(super) fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

pub(super) fn router(locker: Locker, options: ServiceOptions) -> Router {
    let openapi = openapi().to_json().unwrap_or_default();
    let state = AppState {
        locker,
        authz: options.authz,
        dev_identity: options.dev_identity,
        max_wait: options.max_wait,
        max_ttl: options.max_ttl,
        force: options.force,
        rates: Arc::default(),
        metrics: super::metrics::Metrics::new(),
        openapi: Arc::new(openapi),
    };
    let metrics = state.metrics.clone();
    let mut router = Router::new();
    for r in table() {
        router = router.route(r.path, r.handler);
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(options.body_limit))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: axum::middleware::Next| {
                let metrics = metrics.clone();
                async move {
                    let resp = next.run(req).await;
                    if let Some(seen) = resp.extensions().get::<super::problem::ProblemSeen>() {
                        metrics.problem(*seen);
                    }
                    resp
                }
            },
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

type ApiResult<T> = Result<T, Problem>;

/// Prometheus text of this replica's metrics (no identity needed).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format 0.0.4",
        content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// This document (no identity needed).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "operations",
    responses((status = 200, description = "the OpenAPI 3.1 document of this API",
        content_type = "application/json", body = Object)))]
async fn openapi_json(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        state.openapi.as_str().to_owned(),
    )
}

async fn not_found() -> Problem {
    Problem::new(ProblemKind::NotFound, "no such route")
}

async fn method_not_allowed() -> Problem {
    Problem::new(
        ProblemKind::InvalidInput,
        "method not allowed on this route",
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

fn parse_session(s: &str) -> ApiResult<LeaseId> {
    if s.len() == 16 {
        if let Ok(v) = u64::from_str_radix(s, 16) {
            if let Ok(v) = i64::try_from(v) {
                if v > 0 {
                    return Ok(LeaseId::new(v));
                }
            }
        }
    }
    Err(Problem::new(
        ProblemKind::InvalidInput,
        "a session id is 16 lower-case hex digits",
    ))
}

fn forbidden(what: &str) -> Problem {
    Problem::new(ProblemKind::Forbidden, what.to_owned())
}

/// What a request that names a gone session counts in `palisade_expiries_total`.
#[derive(Debug, Clone, Copy)]
enum Expiry {
    /// Nothing (acquire, close).
    Uncounted,
    /// `kind="session"` (keepalive).
    Session,
    /// `kind="hold"` (release).
    Hold,
}

impl AppState {
    fn count_expiry(&self, expiry: Expiry) {
        let kind = match expiry {
            Expiry::Uncounted => return,
            Expiry::Session => "session",
            Expiry::Hold => "hold",
        };
        self.metrics.expiries.with_label_values(&[kind]).inc();
    }
}

/// The session's record, if `caller` owns it. A session whose lease is gone is 404, and
/// counted as `expiry`.
async fn owned_session(
    state: &AppState,
    caller: &Caller,
    session: &str,
    expiry: Expiry,
) -> ApiResult<SessionRecord> {
    let lease = parse_session(session)?;
    let record = state.locker.session_record(lease).await.map_err(|e| {
        if e.is_session_lost() {
            state.count_expiry(expiry);
            Problem::new(ProblemKind::NotFound, "no live session with this id")
        } else {
            e.into()
        }
    })?;
    if record.spiffe_id != caller.0 {
        return Err(forbidden("the session belongs to another identity"));
    }
    Ok(record)
}

fn not_a_namespace() -> Problem {
    Problem::new(ProblemKind::NotFound, "no such namespace")
}

/// Draws one operation from `ns`'s `op_rate_quota`.
async fn rate_check(state: &AppState, ns: &str) -> ApiResult<()> {
    crate::model::validate_name(ns)?;
    let namespace = state
        .locker
        .namespace(ns)
        .await?
        .ok_or_else(not_a_namespace)?;
    state.rates.check(ns, namespace.op_rate_quota)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl IntoResponse for crate::error::Error {
    fn into_response(self) -> Response {
        Problem::from(self).into_response()
    }
}
