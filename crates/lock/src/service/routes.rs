//! The handlers. Each checks input and authorization before it talks to etcd.

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::authz::Authz;
use super::force::{ForceReleases, ForcedRelease};
use super::identity::Caller;
use super::problem::{Problem, ProblemKind};
use super::ServiceOptions;
use crate::detached::SessionRecord;
use crate::epoch::EpochReason;
use crate::locker::{LockName, Locker};
use crate::model::{Enforcement, LeaseId, LockClass, Mode, Namespace, QuorumPolicy};
use crate::{FencingToken, Revision};

#[derive(Clone)]
pub(crate) struct AppState {
    locker: Locker,
    authz: Authz,
    pub(crate) dev_identity: bool,
    max_wait: Duration,
    max_ttl: Duration,
    force: Option<ForceReleases>,
    rates: std::sync::Arc<super::rate::RateLimits>,
    metrics: super::metrics::Metrics,
}

pub(super) fn router(locker: Locker, options: ServiceOptions) -> Router {
    let state = AppState {
        locker,
        authz: options.authz,
        dev_identity: options.dev_identity,
        max_wait: options.max_wait,
        max_ttl: options.max_ttl,
        force: options.force,
        rates: std::sync::Arc::default(),
        metrics: super::metrics::Metrics::new(),
    };
    let metrics = state.metrics.clone();
    let v1 = Router::new()
        .route("/sessions", post(open_session))
        .route("/sessions/{session}/keepalive", post(keepalive))
        .route("/sessions/{session}", delete(close_session))
        .route("/locks/acquire", post(acquire))
        .route("/locks/release", post(release))
        .route("/locks/status", get(status))
        .route("/namespaces", get(list_namespaces))
        .route("/namespaces/{ns}", put(put_namespace))
        .route("/namespaces/{ns}/classes", get(list_classes))
        .route("/namespaces/{ns}/classes/{class}", put(put_class))
        .route("/epoch", get(show_epoch))
        .route("/epoch/advance", post(advance_epoch))
        .route("/force-releases", post(request_force_release))
        .route("/force-releases/{id}/approve", post(approve_force_release));
    Router::new()
        .nest("/v1", v1)
        .route("/metrics", get(metrics_text))
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

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
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

/// `Json<T>` whose rejections are problems (400, 413, 415, 422).
struct Body<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(r) => Err(json_problem(&r)),
        }
    }
}

fn json_problem(r: &JsonRejection) -> Problem {
    Problem::new(ProblemKind::InvalidInput, r.body_text()).with_status(r.status())
}

/// `Path<T>` whose rejections are 400 problems.
struct PathArgs<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathArgs<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathArgs(p.0))
            .map_err(|r: PathRejection| Problem::new(ProblemKind::InvalidInput, r.body_text()))
    }
}

/// `Query<T>` whose rejections are 400 problems.
struct QueryArgs<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|r: QueryRejection| Problem::new(ProblemKind::InvalidInput, r.body_text()))
    }
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

/// The session's record, if `caller` owns it.
async fn owned_session(
    state: &AppState,
    caller: &Caller,
    session: &str,
) -> ApiResult<SessionRecord> {
    let lease = parse_session(session)?;
    let record = state.locker.session_record(lease).await.map_err(|e| {
        if e.is_session_lost() {
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
        .config()
        .namespace(ns)
        .await?
        .ok_or_else(not_a_namespace)?;
    state.rates.check(ns, namespace.op_rate_quota)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenSession {
    ttl_ms: u64,
}

#[derive(Serialize)]
struct SessionView {
    session: String,
    spiffe_id: String,
    ttl_ms: u64,
    opened_rev: Revision,
}

async fn open_session(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<OpenSession>,
) -> ApiResult<impl IntoResponse> {
    let ttl = Duration::from_millis(body.ttl_ms);
    if body.ttl_ms % 1000 != 0 || ttl < Duration::from_secs(1) || ttl > state.max_ttl {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!(
                "ttl_ms must be a whole number of seconds from 1000 to {}",
                ms(state.max_ttl)
            ),
        ));
    }
    let record = state.locker.open_detached_session(caller.0, ttl).await?;
    Ok((
        StatusCode::CREATED,
        Json(SessionView {
            session: record.lease.to_string(),
            spiffe_id: record.spiffe_id.as_str().to_owned(),
            ttl_ms: ms(record.ttl),
            opened_rev: record.opened_rev,
        }),
    ))
}

#[derive(Serialize)]
struct KeepaliveView {
    ttl_ms: u64,
}

async fn keepalive(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(session): PathArgs<String>,
) -> ApiResult<Json<KeepaliveView>> {
    let record = owned_session(&state, &caller, &session).await?;
    let ttl = state.locker.keep_alive_once(record.lease).await?;
    Ok(Json(KeepaliveView { ttl_ms: ms(ttl) }))
}

async fn close_session(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(session): PathArgs<String>,
) -> ApiResult<StatusCode> {
    let record = owned_session(&state, &caller, &session).await?;
    state.locker.revoke_session(record.lease).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    session: String,
    namespace: String,
    class: String,
    key: String,
    mode: Mode,
    wait_ms: u64,
}

#[derive(Serialize)]
struct HoldView {
    session: String,
    namespace: String,
    class: String,
    key: String,
    mode: Mode,
    /// `None` for an unprotected grant (open class, etcd unavailable).
    token: Option<FencingToken>,
    grant_rev: Option<Revision>,
    enforcement: Enforcement,
}

async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<AcquireBody>,
) -> ApiResult<Json<HoldView>> {
    let wait = Duration::from_millis(body.wait_ms);
    if wait.is_zero() || wait > state.max_wait {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!("wait_ms must be from 1 to {}", ms(state.max_wait)),
        ));
    }
    if !state
        .authz
        .current()
        .may_lock(&body.namespace, &body.class, &caller.0)
    {
        return Err(forbidden("not allowed to lock this class"));
    }
    let record = owned_session(&state, &caller, &body.session).await?;
    let session = state.locker.attach_session(&record);
    let name = LockName::new(body.namespace, body.class, body.key);
    crate::model::validate_name(&name.ns)?;
    crate::model::validate_name(&name.class)?;
    crate::keys::validate_key(&name.key)?;
    let namespace = state
        .locker
        .config()
        .namespace(&name.ns)
        .await?
        .ok_or_else(not_a_namespace)?;
    state.rates.check(&namespace.id, namespace.op_rate_quota)?;
    let started = std::time::Instant::now();
    let deadline = Instant::now() + wait;
    let slot = super::quota::take(
        &state.locker,
        &name,
        record.lease,
        body.mode,
        namespace.held_lease_quota,
        deadline,
    )
    .await?;
    let hold = state
        .locker
        .acquire(&session, &name, body.mode, deadline)
        .await;
    state
        .metrics
        .wait_seconds
        .observe(started.elapsed().as_secs_f64());
    let hold = hold?;
    slot.keep();
    state.metrics.grants.inc();
    let view = HoldView {
        session: record.lease.to_string(),
        namespace: name.ns,
        class: name.class,
        key: name.key,
        mode: hold.mode(),
        token: hold.token(),
        grant_rev: hold.grant_rev(),
        enforcement: hold.enforcement(),
    };
    hold.forget();
    Ok(Json(view))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    session: String,
    namespace: String,
    class: String,
    key: String,
    mode: Mode,
    grant_rev: Revision,
}

async fn release(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<ReleaseBody>,
) -> ApiResult<StatusCode> {
    let record = owned_session(&state, &caller, &body.session).await?;
    rate_check(&state, &body.namespace).await?;
    let name = LockName::new(body.namespace, body.class, body.key);
    let released = state
        .locker
        .release_by(&name, record.lease, body.mode, body.grant_rev)
        .await;
    if !matches!(&released, Err(e) if matches!(e.kind(), crate::error::ErrorKind::InvalidInput(_)))
    {
        let key = super::quota::slot_key(&state.locker, &name, record.lease, body.mode);
        super::quota::free(&state.locker, key).await;
    }
    released?;
    state.metrics.releases.inc();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    namespace: String,
    class: String,
    key: String,
}

#[derive(Serialize)]
struct HolderView {
    session: String,
    mode: Mode,
    grant_rev: Revision,
    token: FencingToken,
    spiffe_id: String,
}

#[derive(Serialize)]
struct WaiterView {
    session: String,
    mode: Mode,
    create_rev: Revision,
    spiffe_id: String,
}

#[derive(Serialize)]
struct StatusView {
    revision: Revision,
    class: LockClass,
    holders: Vec<HolderView>,
    waiters: Vec<WaiterView>,
}

async fn status(
    State(state): State<AppState>,
    caller: Caller,
    QueryArgs(q): QueryArgs<StatusQuery>,
) -> ApiResult<Json<StatusView>> {
    let authz = state.authz.current();
    if !authz.may_lock(&q.namespace, &q.class, &caller.0)
        && !authz.is_ns_admin(&q.namespace, &caller.0)
    {
        return Err(forbidden("not allowed to see this class"));
    }
    rate_check(&state, &q.namespace).await?;
    let name = LockName::new(q.namespace, q.class, q.key);
    crate::keys::validate_key(&name.key)?;
    let class = state.locker.config().class(&name.ns, &name.class).await?;
    let lock = state.locker.lock_state(&name).await?;
    Ok(Json(StatusView {
        revision: lock.revision,
        class,
        holders: lock
            .holders
            .into_iter()
            .map(|h| HolderView {
                session: h.lease.to_string(),
                mode: h.mode,
                grant_rev: h.grant_rev,
                token: h.token,
                spiffe_id: h.spiffe_id,
            })
            .collect(),
        waiters: lock
            .waiters
            .into_iter()
            .map(|w| WaiterView {
                session: w.lease.to_string(),
                mode: w.mode,
                create_rev: w.create_rev,
                spiffe_id: w.spiffe_id,
            })
            .collect(),
    }))
}

async fn list_namespaces(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<Namespace>>> {
    let authz = state.authz.current();
    let all = state.locker.config().namespaces().await?;
    Ok(Json(
        all.into_iter()
            .filter(|n| authz.is_ns_admin(&n.id, &caller.0))
            .collect(),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceBody {
    tenant_id: String,
    held_lease_quota: Option<u32>,
    op_rate_quota: Option<u32>,
    cluster_tier: Option<String>,
}

async fn put_namespace(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(ns): PathArgs<String>,
    Body(body): Body<NamespaceBody>,
) -> ApiResult<Json<Namespace>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden("only service admins manage namespaces"));
    }
    let mut n = Namespace::new(ns, body.tenant_id);
    if let Some(q) = body.held_lease_quota {
        n.held_lease_quota = q;
    }
    if let Some(q) = body.op_rate_quota {
        n.op_rate_quota = q;
    }
    if let Some(t) = body.cluster_tier {
        n.cluster_tier = t;
    }
    state.locker.config().put_namespace(&n).await?;
    Ok(Json(n))
}

async fn list_classes(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(ns): PathArgs<String>,
) -> ApiResult<Json<Vec<LockClass>>> {
    if !state.authz.current().is_ns_admin(&ns, &caller.0) {
        return Err(forbidden("only admins of the namespace list its classes"));
    }
    Ok(Json(state.locker.config().classes(&ns).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassBody {
    #[serde(default)]
    key_prefix: String,
    ttl_min_ms: Option<u64>,
    ttl_max_ms: Option<u64>,
    mode: Option<Mode>,
    enforcement: Option<Enforcement>,
    on_quorum_loss: Option<QuorumPolicy>,
    lock_delay_ms: Option<u64>,
}

async fn put_class(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs((ns, class)): PathArgs<(String, String)>,
    Body(body): Body<ClassBody>,
) -> ApiResult<Json<LockClass>> {
    if !state.authz.current().is_ns_admin(&ns, &caller.0) {
        return Err(forbidden("only admins of the namespace manage its classes"));
    }
    let mut c = LockClass::new(ns, class, body.key_prefix);
    if let Some(v) = body.ttl_min_ms {
        c.ttl_min = Duration::from_millis(v);
    }
    if let Some(v) = body.ttl_max_ms {
        c.ttl_max = Duration::from_millis(v);
    }
    if let Some(v) = body.mode {
        c.mode = v;
    }
    if let Some(v) = body.enforcement {
        c.enforcement = v;
    }
    if let Some(v) = body.on_quorum_loss {
        c.on_quorum_loss = v;
    }
    if let Some(v) = body.lock_delay_ms {
        c.lock_delay = Duration::from_millis(v);
    }
    state.locker.config().put_class(&c).await?;
    Ok(Json(c))
}

#[derive(Serialize)]
struct EpochView {
    #[serde(flatten)]
    record: crate::epoch::EpochRecord,
    /// Why grants are refused, if they are.
    grants_refused: Option<String>,
}

async fn show_epoch(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<EpochView>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden("only service admins see the epoch"));
    }
    let (record, mismatch) = state.locker.epoch();
    Ok(Json(EpochView {
        record,
        grants_refused: mismatch.map(|m| m.to_string()),
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum AdvanceReason {
    Restore,
    Rehome,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdvanceBody {
    reason: AdvanceReason,
}

async fn advance_epoch(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<AdvanceBody>,
) -> ApiResult<Json<EpochView>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden("only service admins advance the epoch"));
    }
    let reason = match body.reason {
        AdvanceReason::Restore => EpochReason::Restore,
        AdvanceReason::Rehome => EpochReason::Rehome,
    };
    let record = state.locker.advance_epoch(reason).await?;
    tracing::warn!(epoch = %record.epoch, caller = caller.0.as_str(), "epoch advanced");
    Ok(Json(EpochView {
        record,
        grants_refused: None,
    }))
}

fn force_of(state: &AppState) -> ApiResult<&ForceReleases> {
    state.force.as_ref().ok_or_else(|| {
        Problem::new(
            ProblemKind::NotFound,
            "force release is not configured on this service (no database)",
        )
    })
}

fn db_problem(e: &tokio_postgres::Error) -> Problem {
    tracing::error!(error = %e, "force release database error");
    Problem::new(ProblemKind::Upstream, "the force release database failed")
}

/// The longest force release reason, in bytes.
const MAX_REASON_LEN: usize = 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceRequestBody {
    namespace: String,
    class: String,
    key: String,
    reason: String,
}

#[derive(Serialize)]
struct ForceRequestView {
    id: String,
    namespace: String,
    class: String,
    key: String,
    requester: String,
    reason: String,
}

async fn request_force_release(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<ForceRequestBody>,
) -> ApiResult<impl IntoResponse> {
    let force = force_of(&state)?;
    crate::model::validate_name(&body.namespace)?;
    crate::model::validate_name(&body.class)?;
    crate::keys::validate_key(&body.key)?;
    if body.reason.trim().is_empty() || body.reason.len() > MAX_REASON_LEN {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!("reason must be 1 to {MAX_REASON_LEN} bytes, not blank"),
        ));
    }
    if !state
        .authz
        .current()
        .is_ns_admin(&body.namespace, &caller.0)
    {
        return Err(forbidden(
            "only admins of the namespace request force releases",
        ));
    }
    let id = force
        .insert(
            &body.namespace,
            &body.class,
            &body.key,
            caller.0.as_str(),
            &body.reason,
        )
        .await
        .map_err(|e| db_problem(&e))?;
    tracing::warn!(%id, requester = caller.0.as_str(), ns = %body.namespace, class = %body.class, key = %body.key, "force release requested");
    Ok((
        StatusCode::CREATED,
        Json(ForceRequestView {
            id,
            namespace: body.namespace,
            class: body.class,
            key: body.key,
            requester: caller.0.as_str().to_owned(),
            reason: body.reason,
        }),
    ))
}

#[derive(Serialize)]
struct ReleasedView {
    session: String,
    mode: Mode,
    token: FencingToken,
    revision: Revision,
}

#[derive(Serialize)]
struct ApproveView {
    id: String,
    requester: String,
    approver: String,
    class_was_fenced: bool,
    released: Vec<ReleasedView>,
}

async fn approve_force_release(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(id): PathArgs<String>,
) -> ApiResult<Json<ApproveView>> {
    let force = force_of(&state)?;
    let not_found = || {
        Problem::new(
            ProblemKind::NotFound,
            "no force release request with this id",
        )
    };
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    let req = force
        .get(&id)
        .await
        .map_err(|e| db_problem(&e))?
        .ok_or_else(not_found)?;
    if !state.authz.current().is_ns_admin(&req.namespace, &caller.0) {
        return Err(forbidden(
            "only admins of the namespace approve force releases",
        ));
    }
    if req.requester == caller.0.as_str() {
        return Err(forbidden(
            "a force release needs a second admin: the requester cannot approve it",
        ));
    }
    if req.approver.is_some()
        || !force
            .claim(&id, caller.0.as_str())
            .await
            .map_err(|e| db_problem(&e))?
    {
        return Err(Problem::new(
            ProblemKind::AlreadyApproved,
            "this request was already approved",
        ));
    }
    let class = state
        .locker
        .config()
        .class(&req.namespace, &req.class)
        .await?;
    let class_was_fenced = class.enforcement == Enforcement::Fenced;
    let name = LockName::new(req.namespace, req.class, req.key);
    let lock = state.locker.lock_state(&name).await?;
    let marker = crate::force::ForceMarker {
        request_id: id.clone(),
        requester: req.requester.clone(),
        reason: req.reason.clone(),
    };
    let cluster_id = state.locker.epoch().0.cluster_id;
    let mut released = Vec::new();
    for h in lock.holders {
        let revision = match state
            .locker
            .force_release(&name, h.lease, h.mode, &marker)
            .await
        {
            Ok(rev) => rev,
            // Released or expired since the read: nothing to force.
            Err(e) if e.kind() == &crate::error::ErrorKind::NotHeld => continue,
            Err(e) => return Err(e.into()),
        };
        let request_id = if released.is_empty() {
            id.clone()
        } else {
            format!("{id}.{}", released.len())
        };
        tracing::warn!(%request_id, %revision, requester = %req.requester, approver = caller.0.as_str(), "hold force-released");
        force
            .audit
            .record(ForcedRelease {
                request_id,
                cluster_id,
                revision,
                lock_key: name.key.clone(),
                requester: req.requester.clone(),
                approver: caller.0.as_str().to_owned(),
                reason: req.reason.clone(),
                class_was_fenced,
                at: std::time::SystemTime::now(),
            })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "force release not recorded in the audit trail");
                Problem::new(
                    ProblemKind::Internal,
                    "the hold was force-released but the audit record failed",
                )
            })?;
        released.push(ReleasedView {
            session: h.lease.to_string(),
            mode: h.mode,
            token: h.token,
            revision,
        });
    }
    Ok(Json(ApproveView {
        id,
        requester: req.requester,
        approver: caller.0.as_str().to_owned(),
        class_was_fenced,
        released,
    }))
}

impl IntoResponse for crate::error::Error {
    fn into_response(self) -> Response {
        Problem::from(self).into_response()
    }
}
