//! Sessions: open, keepalive, close.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::extract::{Body, PathArgs};
use super::{
    forbidden, ms, not_a_namespace, owned_session, wrong_tier, ApiResult, AppState, Expiry,
};
use crate::identity::Caller;
use crate::openapi::{CloseProblems, KeepaliveProblems, OpenProblems};
use crate::problem::Problem;
use palisade_api::routes;
use palisade_api::wire::{ForcedHoldView, KeepaliveView, OpenSessionBody, SessionView};
use palisade_api::ProblemKind;
use palisade_api::Revision;

/// Opens a session for the caller.
#[utoipa::path(post, path = routes::SESSIONS, tag = "sessions",
    request_body = OpenSessionBody,
    responses((status = 201, description = "the session", body = SessionView), OpenProblems))]
pub(super) async fn open_session(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<OpenSessionBody>,
) -> ApiResult<impl IntoResponse> {
    let ttl = session_ttl(body.ttl_ms, state.max_ttl)?;
    if let Some(t) = &body.tier {
        palisade_api::validate_name(t)?;
        state.tiers.locker(t)?;
        check_tier_use(&state, &caller, t).await?;
    }
    // `tier_of` only routes; `namespace` also takes a quota slot below.
    let routed = match &body.tier_of {
        Some(ns) => Some(namespace_tier(&state, &caller, ns).await?.0),
        None => None,
    };
    let (quota, ns_tier) = match &body.namespace {
        Some(ns) => {
            let (tier, quota) = namespace_tier(&state, &caller, ns).await?;
            (Some(quota), Some((ns, tier)))
        }
        None => (None, None),
    };
    // The tier asked for, else the namespace's; each that is given must agree.
    let mut tier = body.tier.clone();
    for (ns, t) in body.tier_of.iter().zip(routed).chain(ns_tier) {
        match &tier {
            Some(asked) if *asked != t => return Err(wrong_tier(ns, &t)),
            _ => tier = Some(t),
        }
    }
    let tier = tier.unwrap_or_else(|| state.tiers.home_name().to_owned());
    let locker = state.tiers.locker(&tier)?.clone();
    let record = open_limited(&state, &caller, &tier, ttl).await?;
    if let (Some(ns), Some(quota)) = (&body.namespace, quota) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        match locker
            .take_session_quota_slot(ns, record.lease, quota, deadline)
            .await
        {
            Ok(slot) => slot.keep(),
            Err(e) => {
                // No slot, no session: nothing of it stays.
                if let Err(e) = locker.revoke_session(record.lease).await {
                    tracing::warn!(error = %e, "session over quota not revoked; it expires");
                }
                return Err(e.into());
            }
        }
    }
    Ok((
        StatusCode::CREATED,
        Json(SessionView {
            session: state.session_id(&tier, record.lease),
            spiffe_id: record.spiffe_id.as_str().to_owned(),
            ttl_ms: ms(record.ttl),
            opened_rev: record.opened_rev,
            namespace: body.namespace,
            tier,
        }),
    ))
}

/// Whether `caller` may open a session on `tier` by naming it, as it may by naming a
/// namespace (`tier_of`): the home tier is everyone's (a session opened without a tier
/// lands there); another tier only for a service admin, or for a caller the
/// authorization config lets use a namespace that lives on it. 403 otherwise.
async fn check_tier_use(state: &AppState, caller: &Caller, tier: &str) -> ApiResult<()> {
    if tier == state.tiers.home_name() {
        return Ok(());
    }
    let authz = state.authz.current();
    if authz.is_admin(&caller.0) {
        return Ok(());
    }
    for rules in &authz.namespace {
        if !authz.may_use_namespace(&rules.id, &caller.0) {
            continue;
        }
        if let Some((on, _)) = state.tiers.namespace(&rules.id).await? {
            if on == tier {
                return Ok(());
            }
        }
    }
    Err(forbidden(
        caller,
        &format!("open a session on tier {tier}"),
        "the authorization config grants it no namespace on that tier",
    ))
}

/// Opens a detached session of `caller` on `tier`, within the per-identity session limit,
/// which holds across every tier: the identity's sessions on the other tiers, counted
/// first, take their share of it, and this tier's count and take are one atomic step on
/// its cluster. (Two opens on two tiers at the same moment can each miss the other's:
/// no Txn spans two etcd clusters.) 429 `quota-exceeded` past the limit.
async fn open_limited(
    state: &AppState,
    caller: &Caller,
    tier: &str,
    ttl: Duration,
) -> ApiResult<palisade_lock::SessionRecord> {
    let limit = state.max_sessions_per_identity;
    let mut elsewhere = 0u32;
    for (_, other) in state.tiers.iter().filter(|(name, _)| *name != tier) {
        elsewhere = elsewhere.saturating_add(other.open_sessions_of(&caller.0).await?);
    }
    let over = || {
        Problem::new(
            ProblemKind::QuotaExceeded,
            format!(
                "this identity already has {limit} open sessions (across every tier), the \
                 service's limit per identity"
            ),
        )
    };
    let left = limit.saturating_sub(elsewhere);
    if left == 0 {
        return Err(over());
    }
    let locker = state.tiers.locker(tier)?;
    match locker
        .open_detached_session_limited(caller.0.clone(), ttl, Some(left))
        .await
    {
        Ok(record) => Ok(record),
        Err(e) if matches!(e.kind(), palisade_lock::ErrorKind::SessionLimit { .. }) => Err(over()),
        Err(e) => Err(e.into()),
    }
}

/// The tier namespace `ns` lives on and its `held_lease_quota`, if `caller` may use it
/// (403 otherwise, 404 for a namespace that does not exist).
async fn namespace_tier(state: &AppState, caller: &Caller, ns: &str) -> ApiResult<(String, u32)> {
    palisade_api::validate_name(ns)?;
    if !state.authz.current().may_use_namespace(ns, &caller.0) {
        return Err(forbidden(
            caller,
            &format!("use namespace {ns}"),
            "the authorization config grants it no class of the namespace",
        ));
    }
    let (tier, namespace) = state
        .tiers
        .namespace(ns)
        .await?
        .ok_or_else(|| not_a_namespace(ns))?;
    Ok((tier, namespace.held_lease_quota))
}

/// `ttl_ms` of an [`OpenSessionBody`] as a TTL: a whole number of seconds from 1 s to
/// `max_ttl` (the rule of [`palisade_api::limits::check_session_ttl`]).
pub(super) fn session_ttl(ttl_ms: u64, max_ttl: Duration) -> ApiResult<Duration> {
    let ttl = Duration::from_millis(ttl_ms);
    palisade_api::limits::check_session_ttl(ttl, max_ttl)
        .map_err(|e| Problem::new(ProblemKind::InvalidInput, format!("ttl_ms: {e}")))?;
    Ok(ttl)
}

/// Renews the session's lease, and so every hold and wait of the session. The answer
/// lists the session's holds that were force-released while it lived (`forced`).
#[utoipa::path(post, path = routes::KEEPALIVE, tag = "sessions",
    params(("session" = String, Path, description = "the session id: 16 lower-case hex digits, or <tier>.<16 hex digits>")),
    responses((status = 200, description = "renewed", body = KeepaliveView), KeepaliveProblems))]
pub(super) async fn keepalive(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(session): PathArgs<String>,
) -> ApiResult<Json<KeepaliveView>> {
    let (record, on) = owned_session(&state, &caller, &session, Expiry::Session).await?;
    let ttl = on
        .locker
        .keep_alive_once(record.lease)
        .await
        .inspect_err(|e| {
            if e.is_session_lost() {
                state.count_expiry(Expiry::Session);
            }
        })?;
    let forced = record
        .forced
        .into_iter()
        .map(|n| ForcedHoldView {
            namespace: n.namespace,
            class: n.class,
            key: n.key,
            mode: n.mode,
            grant_rev: Revision::new(n.grant_rev),
            request_id: n.request_id,
        })
        .collect();
    Ok(Json(KeepaliveView {
        ttl_ms: ms(ttl),
        forced,
    }))
}

/// Closes the session: revokes its lease, which ends every hold and wait of it.
#[utoipa::path(delete, path = routes::SESSION, tag = "sessions",
    params(("session" = String, Path, description = "the session id: 16 lower-case hex digits, or <tier>.<16 hex digits>")),
    responses((status = 204, description = "closed; every hold of the session ended"), CloseProblems))]
pub(super) async fn close_session(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(session): PathArgs<String>,
) -> ApiResult<StatusCode> {
    let (record, on) = owned_session(&state, &caller, &session, Expiry::Uncounted).await?;
    on.locker.revoke_session(record.lease).await?;
    Ok(StatusCode::NO_CONTENT)
}
