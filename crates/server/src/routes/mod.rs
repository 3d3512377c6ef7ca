//! The handlers, and the router built from them. Each handler refuses bad input and
//! unauthorized callers before anything is written to etcd. Each route is declared once,
//! in its handler's `utoipa::path` attribute; `api` turns those into both the router and
//! the OpenAPI document.
//!
//! # Routes
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `POST /v1/sessions` | `{"ttl_ms","namespace"?,"tier"?,"tier_of"?}` | 201 `{"session","spiffe_id","ttl_ms","opened_rev","namespace","tier"}` |
//! | `POST /v1/sessions/{session}/keepalive` | none | 200 `{"ttl_ms"}` |
//! | `DELETE /v1/sessions/{session}` | none | 204; every hold of the session ends |
//! | `POST /v1/locks/acquire` | `{"session","namespace","class","key","mode","wait_ms","holder_meta"?}` | 200 `{"token","grant_rev",...}` |
//! | `POST /v1/locks/release` | `{"session","namespace","class","key","mode","grant_rev"}` | 204 |
//! | `GET /v1/locks/status?namespace=&class=&key=` | none | 200 holders (with tokens and `holder_meta`), waiters in order, class |
//! | `GET /v1/namespaces` | none | 200 list |
//! | `PUT /v1/namespaces/{ns}` | `{"tenant_id",...}` | 200, create or update |
//! | `GET /v1/namespaces/{ns}/classes` | none | 200 list |
//! | `PUT /v1/namespaces/{ns}/classes/{class}` | `{"key_prefix","ttl_min_ms",...}` | 200, create or update |
//! | `GET /v1/epoch?tier=` | none | 200 the epoch record of the tier (default: the home tier), and why grants are refused if they are |
//! | `POST /v1/epoch/advance` | `{"reason":"restore"\|"rehome","tier"?}` | 200 the new record, above every tier's epochs |
//! | `POST /v1/namespaces/{ns}/rehome` | `{"to","drain_ms"?}` | 200 `{"namespace","from","to","epoch"}` (service admins) |
//! | `GET /v1/openapi.json` | none | 200 the OpenAPI 3.1 document of every route here, with the problem responses of each (no identity needed) |
//! | `GET /metrics` | none | 200 Prometheus text: grants, acquire wait time, timeouts, releases, lost holds, quota rejections, etcd errors, expiries (no identity needed) |
//! | `POST /v1/force-releases` | `{"namespace","class","key","reason"}` | 201 `{"id",...}`: a request, nothing deleted yet |
//! | `POST /v1/force-releases/{id}/approve` | none | 200 `{"id","requester","approver","class_was_fenced","released":[{"session","mode","token","revision"}]}` |
//!
//! # Tiers
//!
//! With [`ServiceOptions::with_tiers`](crate::ServiceOptions::with_tiers) the service
//! fronts several etcd clusters (see `palisade_lock::Tiers`). A session is opened on
//! one tier: the one `tier` names, else the tier of `tier_of` or `namespace` if given
//! (each given must agree, else 409 `wrong-tier`), else the home tier; its id is
//! `<tier>.<lease hex>` off the home tier. A `tier` other than the home tier is
//! authorized as `tier_of` is: a service admin, or a caller granted some namespace on
//! that tier (else 403). The per-identity session limit counts every tier's sessions.
//! `tier_of` only routes the session, while
//! `namespace` also takes a slot of that namespace's `held_lease_quota` for the session
//! itself; the CLI's `lock acquire` and `lock run` send `tier_of`, so a user who names
//! only the lock gets a session where its namespace lives. An acquire of a namespace that
//! lives on another tier than the session's is 409 `wrong-tier`, whose detail names the
//! tier to open a session on; one refused by a rehome's fence (the namespace is moving)
//! is 503 `namespace-moving` with `Retry-After: 1`.
//!
//! `holder_meta` is an optional JSON object stored with the hold (and its waiter key)
//! and listed by status for each holder and waiter, at most
//! [`MAX_HOLDER_META_LEN`](palisade_api::MAX_HOLDER_META_LEN) (1024) bytes as compact JSON;
//! larger is 400 `invalid-input`, anything but an object 422.
//!
//! Tokens are JSON strings (decimal u64). `ttl_ms` is a whole number of seconds in ms,
//! from 1,000 to [`ServiceOptions::with_max_ttl`] (default 1 h); `wait_ms` is 0 (try once, no waiting) to
//! [`ServiceOptions::with_max_wait`] (default 60 s): acquire long-polls that long at most.
//!
//! Every request runs in a `tower-http` trace span (method, path, status, latency), and
//! every etcd call attempt it makes in a child span `etcd` (`op`, `attempt`, `outcome`;
//! see the shared retry policy).
//!
//! The router and the OpenAPI document are built from one declaration per route (the
//! handler's `#[utoipa::path]`, read by `utoipa_axum::routes!`); the OpenAPI document
//! ([`openapi_json`]) is generated (utoipa) from the handlers and their request and
//! response types, so its schemas say what the handlers accept: unknown fields are
//! refused (`additionalProperties: false`), names, session ids and key lengths have
//! their patterns and bounds. What a schema cannot say (the service's configured TTL and
//! wait maxima, `ttl_ms` in whole seconds) is in the field descriptions.
//!
//! # Errors
//!
//! Every error is `application/problem+json` (RFC 9457) with a stable `type`
//! `urn:palisade:problem:<slug>`; see [`ProblemKind`] for slugs and status codes. Bad
//! input (malformed JSON or not UTF-8, unknown fields, wrong types, negative or huge
//! TTLs, bad names or keys, bodies over the limit: 413) is refused with a 4xx before
//! anything is written to etcd. Free text (a force release's `reason` and request id, a
//! namespace's `tenant_id` and `cluster_tier`) keeps the rule of
//! [`palisade_api::validate_text`]: a NUL or other control character, a bidirectional
//! formatting character (as in keys), blank, or over the
//! field's bound is 400 `invalid-input` naming the field and the cause, before etcd or
//! the force release database sees it.
//!

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
use axum::response::IntoResponse;
use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use super::authz::Authz;
use super::identity::Caller;
use super::openapi::Finish;
use crate::force_release::ForceReleases;
use crate::problem::Problem;
use crate::ServiceOptions;
use palisade_api::LeaseId;
use palisade_api::ProblemKind;
use palisade_lock::Locker;
use palisade_lock::SessionRecord;

#[derive(Clone)]
pub(crate) struct AppState {
    /// The home tier's locker: the directory, namespaces, the epoch shown by default.
    locker: Locker,
    tiers: palisade_lock::Tiers,
    authz: Authz,
    pub(crate) dev_identity: bool,
    max_wait: Duration,
    max_ttl: Duration,
    max_sessions_per_identity: u32,
    force: Option<ForceReleases>,
    rates: Arc<super::rate::RateLimits>,
    metrics: super::metrics::Metrics,
    openapi: Arc<String>,
    /// Set when the replica stops: waiting acquires end with 503 `shutting-down`.
    stopping: crate::serve::Stopping,
}

/// Every route, each declared once: its `#[utoipa::path]` attribute gives the method,
/// the path (a `palisade_api::routes` constant) and the responses, and `routes!` builds
/// both the axum route and its OpenAPI operation from it.
fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(utoipa_axum::routes!(sessions::open_session))
        .routes(utoipa_axum::routes!(sessions::keepalive))
        .routes(utoipa_axum::routes!(sessions::close_session))
        .routes(utoipa_axum::routes!(locks::acquire))
        .routes(utoipa_axum::routes!(locks::release))
        .routes(utoipa_axum::routes!(locks::status))
        .routes(utoipa_axum::routes!(admin::list_namespaces))
        .routes(utoipa_axum::routes!(admin::put_namespace))
        .routes(utoipa_axum::routes!(admin::list_classes))
        .routes(utoipa_axum::routes!(admin::put_class))
        .routes(utoipa_axum::routes!(admin::show_epoch))
        .routes(utoipa_axum::routes!(admin::advance_epoch))
        .routes(utoipa_axum::routes!(admin::rehome))
        .routes(utoipa_axum::routes!(force::request_force_release))
        .routes(utoipa_axum::routes!(force::approve_force_release))
        .routes(utoipa_axum::routes!(openapi_json))
        .routes(utoipa_axum::routes!(metrics_text))
}

/// `(method, path)` of every route, from the OpenAPI document the router was built with.
pub(crate) fn routes() -> Vec<(Method, String)> {
    let mut out = Vec::new();
    for (path, item) in openapi().paths.paths {
        let ops = [
            (Method::GET, item.get.is_some()),
            (Method::PUT, item.put.is_some()),
            (Method::POST, item.post.is_some()),
            (Method::DELETE, item.delete.is_some()),
            (Method::PATCH, item.patch.is_some()),
        ];
        for (method, present) in ops {
            if present {
                out.push((method, path.clone()));
            }
        }
    }
    out
}

/// The document-wide parts of the OpenAPI document; the paths come from [`api`].
#[derive(OpenApi)]
#[openapi(
    info(title = "Palisade lock service", description = "Locks on etcd with fencing tokens. \
        Errors are application/problem+json (RFC 9457) with a stable `type` \
        `urn:palisade:problem:<slug>`."),
    modifiers(&Finish),
)]
struct ApiDoc;

/// The OpenAPI 3.1 document of the service.
pub(crate) fn openapi() -> utoipa::openapi::OpenApi {
    api().split_for_parts().1
}

pub(crate) fn router(
    locker: Locker,
    options: ServiceOptions,
    stopping: crate::serve::Stopping,
) -> Router {
    let (routes, doc) = api().split_for_parts();
    let openapi = doc.to_json().unwrap_or_default();
    let tiers = options
        .tiers
        .unwrap_or_else(|| palisade_lock::Tiers::single(palisade_lock::DEFAULT_TIER, locker));
    let state = AppState {
        locker: tiers.home().clone(),
        tiers,
        authz: options.authz,
        dev_identity: options.dev_identity,
        max_wait: options.max_wait,
        max_ttl: options.max_ttl,
        max_sessions_per_identity: options.max_sessions_per_identity,
        force: options.force,
        rates: Arc::default(),
        metrics: super::metrics::Metrics::new(),
        openapi: Arc::new(openapi),
        stopping,
    };
    let metrics = state.metrics.clone();
    routes
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
        // A 5xx is logged here at WARN, not tower-http's default ERROR: most are answers
        // the service chose (503 shutting-down, quorum-lost, namespace-moving), and a fault
        // of its own is logged at ERROR with its cause where the problem is made.
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::WARN)),
        )
        .with_state(state)
}

type ApiResult<T> = Result<T, Problem>;

/// Prometheus text of this replica's metrics (no identity needed).
#[utoipa::path(get, path = palisade_api::routes::METRICS, tag = "operations",
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
#[utoipa::path(get, path = palisade_api::routes::OPENAPI, tag = "operations",
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

/// The tier a session lives on, and its locker.
#[derive(Clone)]
pub(crate) struct OnTier {
    pub(crate) name: String,
    pub(crate) locker: Locker,
}

impl AppState {
    /// The session id the service writes for `lease` on tier `tier`.
    fn session_id(&self, tier: &str, lease: LeaseId) -> String {
        let tier = (tier != self.tiers.home_name()).then(|| tier.to_owned());
        palisade_api::TieredSessionId { tier, lease }.to_string()
    }

    /// The locker of the tier namespace `ns` lives on (the home tier's for a namespace
    /// the directory does not know: its answers then say so).
    async fn ns_locker(&self, ns: &str) -> ApiResult<Locker> {
        palisade_api::validate_name(ns)?;
        Ok(match self.tiers.namespace(ns).await? {
            Some((tier, _)) => self.tiers.locker(&tier)?.clone(),
            None => self.locker.clone(),
        })
    }
}

/// A session id's tier (404 for a tier this service does not have) and lease.
fn parse_session(state: &AppState, s: &str) -> ApiResult<(OnTier, LeaseId)> {
    let id = palisade_api::TieredSessionId::parse(s)?;
    let name = id
        .tier
        .unwrap_or_else(|| state.tiers.home_name().to_owned());
    let locker = state
        .tiers
        .locker(&name)
        .map_err(|_| {
            Problem::new(
                ProblemKind::NotFound,
                format!("no live session {s}: this service has no tier {name}"),
            )
        })?
        .clone();
    Ok((OnTier { name, locker }, id.lease))
}

/// 403 `forbidden`: "`caller` may not `action`: `why`", naming the identity and what
/// (namespace, class, session) it was refused.
fn forbidden(caller: &Caller, action: &str, why: &str) -> Problem {
    Problem::new(
        ProblemKind::Forbidden,
        format!("{} may not {action}: {why}", caller.0.as_str()),
    )
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

/// The session's record and tier, if `caller` owns it. A session whose lease is gone
/// is 404, and counted as `expiry`.
async fn owned_session(
    state: &AppState,
    caller: &Caller,
    session: &str,
    expiry: Expiry,
) -> ApiResult<(SessionRecord, OnTier)> {
    owned_session_from(state, caller, session, expiry, false).await
}

/// [`owned_session`], from the replica's cache of session records when it has the
/// session (no read): for the acquire and release, whose Txns compare the record's
/// create revision, so a stale record fails them and the handler asks again with
/// [`owned_session`].
async fn owned_session_cached(
    state: &AppState,
    caller: &Caller,
    session: &str,
    expiry: Expiry,
) -> ApiResult<(SessionRecord, OnTier)> {
    owned_session_from(state, caller, session, expiry, true).await
}

async fn owned_session_from(
    state: &AppState,
    caller: &Caller,
    session: &str,
    expiry: Expiry,
    cached: bool,
) -> ApiResult<(SessionRecord, OnTier)> {
    let (on, lease) = parse_session(state, session)?;
    let record = if cached {
        on.locker.session_record_cached(lease).await
    } else {
        on.locker.session_record(lease).await
    };
    let record = record.map_err(|e| {
        if e.is_session_lost() {
            state.count_expiry(expiry);
            Problem::from(palisade_api::InvalidInput::UnknownSession(
                session.to_owned(),
            ))
        } else {
            e.into()
        }
    })?;
    if record.spiffe_id != caller.0 {
        return Err(forbidden(
            caller,
            &format!("use session {session}"),
            "it belongs to another identity",
        ));
    }
    Ok((record, on))
}

/// 409 `wrong-tier`: namespace `ns` lives on `tier`, not on the session's tier.
fn wrong_tier(ns: &str, tier: &str) -> Problem {
    Problem::new(
        ProblemKind::WrongTier,
        format!("namespace {ns} lives on tier {tier}: open the session on tier {tier}"),
    )
}

/// 404 `not-found` naming namespace `ns`.
fn not_a_namespace(ns: &str) -> Problem {
    Problem::from(palisade_api::InvalidInput::UnknownNamespace(ns.to_owned()))
}

/// Draws one operation from `ns`'s `op_rate_quota` (the directory's record).
async fn rate_check(state: &AppState, ns: &str) -> ApiResult<()> {
    palisade_api::validate_name(ns)?;
    let (_, namespace) = state
        .tiers
        .namespace(ns)
        .await?
        .ok_or_else(|| not_a_namespace(ns))?;
    state.rates.check(ns, namespace.op_rate_quota)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
