//! Locks: acquire (long-poll), release, status.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::time::Instant;
use utoipa::{IntoParams, ToSchema};

use super::extract::{Body, QueryArgs};
use super::{
    forbidden, ms, not_a_namespace, owned_session, rate_check, ApiResult, AppState, Expiry,
};
use crate::locker::LockName;
use crate::meta::HolderMeta;
use crate::model::{Enforcement, LockClass, Mode};
use crate::service::identity::Caller;
use crate::service::openapi::{AcquireProblems, ReleaseProblems, StatusProblems};
use crate::service::problem::{Problem, ProblemKind};
use crate::{FencingToken, Revision};

/// Acquires a lock for a session, waiting up to `wait_ms`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
    /// The session id, 16 lower-case hex digits.
    #[schema(pattern = "^[0-9a-f]{16}$")]
    session: String,
    /// The namespace, `[a-z0-9][a-z0-9_-]{0,62}`.
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    namespace: String,
    /// The class within the namespace.
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    class: String,
    /// The lock key: 1 to 512 bytes, starting with the class's key prefix.
    #[schema(min_length = 1, max_length = 512)]
    key: String,
    /// `exclusive` or `shared`.
    mode: Mode,
    /// How long to wait in the queue at most, in ms (1 to the service's maximum,
    /// default 60 s).
    #[schema(minimum = 1)]
    wait_ms: u64,
    /// A JSON object stored with the hold and listed by status, at most 1024 bytes as
    /// compact JSON (`MAX_HOLDER_META_LEN`); larger: 400 `invalid-input`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    holder_meta: Option<Map<String, Value>>,
}

/// A granted hold.
#[derive(Serialize, ToSchema)]
pub(super) struct HoldView {
    session: String,
    namespace: String,
    class: String,
    key: String,
    mode: Mode,
    /// The fencing token, a decimal u64 as a string; `null` for an unprotected grant
    /// (open class, etcd unavailable).
    #[schema(value_type = Option<String>)]
    token: Option<FencingToken>,
    /// The revision of the granting Txn; `null` for an unprotected grant.
    #[schema(value_type = Option<u64>)]
    grant_rev: Option<Revision>,
    enforcement: Enforcement,
}

/// Acquires a lock; long-polls until granted or `wait_ms` passes.
#[utoipa::path(post, path = "/v1/locks/acquire", tag = "locks",
    request_body = AcquireBody,
    responses((status = 200, description = "granted", body = HoldView), AcquireProblems))]
pub(super) async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<AcquireBody>,
) -> ApiResult<Json<HoldView>> {
    let wait = acquire_wait(body.wait_ms, state.max_wait)?;
    let holder_meta = body.holder_meta.map(HolderMeta::new).transpose()?;
    if !state
        .authz
        .current()
        .may_lock(&body.namespace, &body.class, &caller.0)
    {
        return Err(forbidden("not allowed to lock this class"));
    }
    let record = owned_session(&state, &caller, &body.session, Expiry::Uncounted).await?;
    let session = state.locker.attach_session(&record);
    let name = LockName::new(body.namespace, body.class, body.key);
    crate::model::validate_name(&name.ns)?;
    crate::model::validate_name(&name.class)?;
    crate::keys::validate_key(&name.key)?;
    let namespace = state
        .locker
        .namespace(&name.ns)
        .await?
        .ok_or_else(not_a_namespace)?;
    state.rates.check(&namespace.id, namespace.op_rate_quota)?;
    let started = std::time::Instant::now();
    let deadline = Instant::now() + wait;
    let slot = crate::service::quota::take(
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
        .acquire_with_meta(&session, &name, body.mode, deadline, holder_meta.as_ref())
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

/// `wait_ms` of an [`AcquireBody`] as a wait: from 1 ms to `max_wait`.
pub(super) fn acquire_wait(wait_ms: u64, max_wait: Duration) -> ApiResult<Duration> {
    let wait = Duration::from_millis(wait_ms);
    if wait.is_zero() || wait > max_wait {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!("wait_ms must be from 1 to {}", ms(max_wait)),
        ));
    }
    Ok(wait)
}

/// Releases one hold, named as the acquire answer named it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReleaseBody {
    #[schema(pattern = "^[0-9a-f]{16}$")]
    session: String,
    namespace: String,
    class: String,
    key: String,
    mode: Mode,
    /// The `grant_rev` of the acquire answer.
    #[schema(value_type = u64)]
    grant_rev: Revision,
}

/// Releases a hold.
#[utoipa::path(post, path = "/v1/locks/release", tag = "locks",
    request_body = ReleaseBody,
    responses((status = 204, description = "released"), ReleaseProblems))]
pub(super) async fn release(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<ReleaseBody>,
) -> ApiResult<StatusCode> {
    let record = owned_session(&state, &caller, &body.session, Expiry::Hold).await?;
    rate_check(&state, &body.namespace).await?;
    let name = LockName::new(body.namespace, body.class, body.key);
    let released = state
        .locker
        .release_by(&name, record.lease, body.mode, body.grant_rev)
        .await;
    if !matches!(&released, Err(e) if matches!(e.kind(), crate::error::ErrorKind::InvalidInput(_)))
    {
        let key = crate::service::quota::slot_key(&state.locker, &name, record.lease, body.mode);
        crate::service::quota::free(&state.locker, key).await;
    }
    released?;
    state.metrics.releases.inc();
    Ok(StatusCode::NO_CONTENT)
}

/// Names one lock.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct StatusQuery {
    /// The namespace.
    namespace: String,
    /// The class.
    class: String,
    /// The lock key.
    key: String,
}

/// One holder of a lock.
#[derive(Serialize, ToSchema)]
pub(super) struct HolderView {
    session: String,
    mode: Mode,
    #[schema(value_type = u64)]
    grant_rev: Revision,
    /// The fencing token, a decimal u64 as a string.
    #[schema(value_type = String)]
    token: FencingToken,
    spiffe_id: String,
    /// What the holder attached at acquire; `null` if nothing.
    #[schema(value_type = Option<Object>)]
    holder_meta: Option<Map<String, Value>>,
}

/// One waiter of a lock, in queue order.
#[derive(Serialize, ToSchema)]
pub(super) struct WaiterView {
    session: String,
    mode: Mode,
    #[schema(value_type = u64)]
    create_rev: Revision,
    spiffe_id: String,
    /// What the waiter attached at acquire; `null` if nothing.
    #[schema(value_type = Option<Object>)]
    holder_meta: Option<Map<String, Value>>,
}

/// A lock at one revision.
#[derive(Serialize, ToSchema)]
pub(super) struct StatusView {
    /// The etcd revision the state was read at.
    #[schema(value_type = u64)]
    revision: Revision,
    class: LockClass,
    holders: Vec<HolderView>,
    /// Waiters, first in line first.
    waiters: Vec<WaiterView>,
}

/// The holders (with tokens), the waiters in order and the class of one lock.
#[utoipa::path(get, path = "/v1/locks/status", tag = "locks",
    params(StatusQuery),
    responses((status = 200, description = "the lock", body = StatusView), StatusProblems))]
pub(super) async fn status(
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
                holder_meta: h.holder_meta,
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
                holder_meta: w.holder_meta,
            })
            .collect(),
    }))
}
