//! Locks: acquire (long-poll), release, status.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use tokio::time::Instant;

use super::extract::{Body, QueryArgs};
use super::{
    forbidden, ms, not_a_namespace, owned_session, owned_session_cached, rate_check, wrong_tier,
    ApiResult, AppState, Expiry,
};
use crate::identity::Caller;
use crate::openapi::{AcquireProblems, ReleaseProblems, StatusProblems};
use crate::problem::Problem;
use palisade_api::routes;
use palisade_api::wire::{
    AcquireBody, ForeignKeyView, HoldView, HolderView, ReleaseBody, StatusQuery, StatusView,
    WaiterView,
};
use palisade_api::HolderMeta;
use palisade_api::ProblemKind;
use palisade_lock::LockName;

/// Acquires a lock; long-polls until granted or `wait_ms` passes. Sent again with the
/// same `attempt` (after a reset connection or a lost answer), it gets the hold that
/// attempt was granted, or takes over its place in the queue. A session that holds or
/// waits for the lock under another attempt is refused (409 `already-held`,
/// `acquire-in-flight`), unless the acquire names the held hold in `replaces` (its
/// holder let it go and its release's outcome is unknown): that hold then ends, with
/// its quota slot.
#[utoipa::path(post, path = routes::ACQUIRE, tag = "locks",
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
        return Err(forbidden(
            &caller,
            &format!("lock class {}/{}", body.namespace, body.class),
            "the authorization config does not grant it",
        ));
    }
    let (record, on) =
        owned_session_cached(&state, &caller, &body.session, Expiry::Uncounted).await?;
    let name = LockName::new(body.namespace, body.class, body.key);
    palisade_api::validate_name(&name.ns)?;
    palisade_api::validate_name(&name.class)?;
    palisade_api::validate_key(&name.key)?;
    let (tier, namespace) = state
        .tiers
        .namespace(&name.ns)
        .await?
        .ok_or_else(|| not_a_namespace(&name.ns))?;
    if tier != on.name {
        return Err(wrong_tier(&name.ns, &tier));
    }
    state.rates.check(&namespace.id, namespace.op_rate_quota)?;
    let started = std::time::Instant::now();
    let deadline = Instant::now() + wait;
    let attempt = palisade_lock::AcquireAttempt {
        id: body.attempt,
        replaces: body.replaces,
    };
    // The namespace's quota slot is taken in the acquire's first Txn, which also checks
    // that the session's record is the one read (or cached) above.
    let acquiring = async {
        let mut record = record;
        let mut read_again = false;
        loop {
            let hold = on
                .locker
                .acquire_attempt_in_quota(
                    &record,
                    &name,
                    body.mode,
                    deadline,
                    holder_meta.as_ref(),
                    attempt,
                    namespace.held_lease_quota,
                )
                .await;
            if read_again
                || !hold
                    .as_ref()
                    .is_err_and(palisade_lock::Error::is_session_lost)
            {
                break ApiResult::Ok((hold, record));
            }
            // The cached record is gone or replaced: read it (a 404 or 403 if so) and try
            // once more on what was read.
            record = owned_session(&state, &caller, &body.session, Expiry::Uncounted)
                .await?
                .0;
            read_again = true;
        }
    };
    // A replica that is stopping ends the wait: the acquire is dropped, which withdraws
    // its waiter key (see palisade_lock's acquire), and the caller is told to retry.
    let (hold, record) = tokio::select! {
        done = acquiring => done?,
        () = state.stopping.clone().stopped() => {
            return Err(Problem::new(
                ProblemKind::ShuttingDown,
                "this replica is stopping: the acquire stopped waiting and holds nothing",
            )
            .with_retry_after(Duration::from_secs(1)));
        }
    };
    state
        .metrics
        .wait_seconds
        .observe(started.elapsed().as_secs_f64());
    let hold = hold?;
    state.metrics.grants.inc();
    let view = HoldView {
        session: state.session_id(&on.name, record.lease),
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

/// `wait_ms` of an [`AcquireBody`] as a wait: from 0 (try once) to `max_wait`.
pub(super) fn acquire_wait(wait_ms: u64, max_wait: Duration) -> ApiResult<Duration> {
    let wait = Duration::from_millis(wait_ms);
    if wait > max_wait {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!("wait_ms must be from 0 to {}", ms(max_wait)),
        ));
    }
    Ok(wait)
}

/// Releases a hold.
#[utoipa::path(post, path = routes::RELEASE, tag = "locks",
    request_body = ReleaseBody,
    responses((status = 204, description = "released"), ReleaseProblems))]
pub(super) async fn release(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<ReleaseBody>,
) -> ApiResult<StatusCode> {
    let (record, on) = owned_session_cached(&state, &caller, &body.session, Expiry::Hold).await?;
    rate_check(&state, &body.namespace).await?;
    let name = LockName::new(body.namespace, body.class, body.key);
    // The release Txn frees the hold's quota slot with the hold, and only then; it also
    // checks that the session's record is the one read (or cached) above. A hold lives
    // on its session's tier, which is where it is released, even after a rehome.
    match on
        .locker
        .release_in_session(&name, &record, body.mode, body.grant_rev)
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_not_held() => {
            // Read the record now: a session gone is 404 (another owner's, 403), and a
            // forced hold is told apart by the notices read with it.
            let (record, _) = owned_session(&state, &caller, &body.session, Expiry::Hold).await?;
            if let Some(n) = record.forced_grant(body.grant_rev) {
                return Err(Problem::new(
                    ProblemKind::HoldForced,
                    format!(
                        "the hold granted at revision {} was force-released (request {})",
                        n.grant_rev, n.request_id
                    ),
                ));
            }
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    }
    state.metrics.releases.inc();
    Ok(StatusCode::NO_CONTENT)
}

/// A key no live session owns, as the wire lists it.
pub(super) fn foreign_view(k: palisade_lock::ForeignKey) -> ForeignKeyView {
    ForeignKeyView {
        key: k.key,
        lease: k.lease.to_string(),
    }
}

/// The holders (with tokens), the waiters in order and the class of one lock, and the
/// keys under it that no live session owns (`foreign_keys`). A key outside the class's
/// key prefix is 400 `invalid-input`, as for an acquire.
#[utoipa::path(get, path = routes::STATUS, tag = "locks",
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
        return Err(forbidden(
            &caller,
            &format!("see class {}/{}", q.namespace, q.class),
            "it neither may lock it nor administers the namespace",
        ));
    }
    rate_check(&state, &q.namespace).await?;
    let name = LockName::new(q.namespace, q.class, q.key);
    palisade_api::validate_key(&name.key)?;
    let locker = state.ns_locker(&name.ns).await?;
    let tier = state.tiers.namespace(&name.ns).await?.map(|(t, _)| t);
    let tier = tier.as_deref().unwrap_or(state.tiers.home_name());
    let class = locker.config().class(&name.ns, &name.class).await?;
    // A key no acquire could take is a mistake, not a lock nobody holds.
    class.check_key(&name.key)?;
    let lock = locker.lock_state(&name).await?;
    Ok(Json(StatusView {
        revision: lock.revision,
        class,
        holders: lock
            .holders
            .into_iter()
            .map(|h| HolderView {
                session: state.session_id(tier, h.lease),
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
                session: state.session_id(tier, w.lease),
                mode: w.mode,
                create_rev: w.create_rev,
                spiffe_id: w.spiffe_id,
                holder_meta: w.holder_meta,
            })
            .collect(),
        foreign_keys: lock.foreign_keys.into_iter().map(foreign_view).collect(),
    }))
}
