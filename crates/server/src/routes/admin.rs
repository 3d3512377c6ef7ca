//! Admin: namespaces, classes, the epoch, rehoming a namespace to another tier.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::extract::{Body, PathArgs, QueryArgs};
use super::{forbidden, ApiResult, AppState};
use crate::identity::Caller;
use crate::openapi::{
    AdvanceEpochProblems, ListClassesProblems, ListNamespacesProblems, PutClassProblems,
    PutNamespaceProblems, RehomeProblems, ShowEpochProblems,
};
use palisade_api::routes;
use palisade_api::wire::{
    AdvanceBody, AdvanceReason, ClassBody, EpochQuery, NamespaceBody, RehomeBody, RehomeView,
};
use palisade_api::EpochReason;
use palisade_api::{InvalidInput, LockClass, Namespace};

/// The namespaces the caller administers.
#[utoipa::path(get, path = routes::NAMESPACES, tag = "admin",
    responses((status = 200, description = "the namespaces the caller administers", body = Vec<Namespace>),
        ListNamespacesProblems))]
pub(super) async fn list_namespaces(
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

/// Creates or replaces a namespace (service admins only).
#[utoipa::path(put, path = routes::NAMESPACE, tag = "admin",
    params(("ns" = String, Path, description = "the namespace, `[a-z0-9][a-z0-9_-]{0,62}`")),
    request_body = NamespaceBody,
    responses((status = 200, description = "stored", body = Namespace), PutNamespaceProblems))]
pub(super) async fn put_namespace(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(ns): PathArgs<String>,
    Body(body): Body<NamespaceBody>,
) -> ApiResult<Json<Namespace>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden(
            &caller,
            &format!("manage namespace {ns}"),
            "only service admins manage namespaces",
        ));
    }
    let mut n = Namespace::new(ns, body.tenant_id);
    if let Some(q) = body.held_lease_quota {
        n.held_lease_quota = q;
    }
    if let Some(q) = body.op_rate_quota {
        n.op_rate_quota = q;
    }
    let existing = state.tiers.namespace(&n.id).await?;
    match (body.cluster_tier, &existing) {
        (Some(t), _) => n.cluster_tier = t,
        // An update keeps the tier the namespace lives on.
        (None, Some((_, old))) => n.cluster_tier.clone_from(&old.cluster_tier),
        (None, None) => n.cluster_tier = state.tiers.home_name().to_owned(),
    }
    n.validate()?;
    let several = state.tiers.iter().nth(1).is_some();
    if several && state.tiers.locker(&n.cluster_tier).is_err() {
        return Err(InvalidInput::UnknownTier(n.cluster_tier).into());
    }
    let tier = state.tiers.tier_of(&n).to_owned();
    if let Some((lives_on, _)) = existing {
        if lives_on != tier {
            return Err(InvalidInput::TierChangeNeedsRehome {
                ns: n.id,
                tier: lives_on,
            }
            .into());
        }
    }
    // The namespace's tier first (its locker reads it), then the directory.
    if tier != state.tiers.home_name() {
        state
            .tiers
            .locker(&tier)?
            .config()
            .put_namespace(&n)
            .await?;
    }
    state.locker.config().put_namespace(&n).await?;
    Ok(Json(n))
}

/// The classes of a namespace (its admins only).
#[utoipa::path(get, path = routes::CLASSES, tag = "admin",
    params(("ns" = String, Path, description = "the namespace")),
    responses((status = 200, description = "the classes", body = Vec<LockClass>), ListClassesProblems))]
pub(super) async fn list_classes(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(ns): PathArgs<String>,
) -> ApiResult<Json<Vec<LockClass>>> {
    if !state.authz.current().is_ns_admin(&ns, &caller.0) {
        return Err(forbidden(
            &caller,
            &format!("list the classes of namespace {ns}"),
            "only admins of the namespace do",
        ));
    }
    Ok(Json(
        state.ns_locker(&ns).await?.config().classes(&ns).await?,
    ))
}

/// Creates or replaces a class (admins of the namespace only).
#[utoipa::path(put, path = routes::CLASS, tag = "admin",
    params(("ns" = String, Path, description = "the namespace"),
        ("class" = String, Path, description = "the class, `[a-z0-9][a-z0-9_-]{0,62}`")),
    request_body = ClassBody,
    responses((status = 200, description = "stored", body = LockClass), PutClassProblems))]
pub(super) async fn put_class(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs((ns, class)): PathArgs<(String, String)>,
    Body(body): Body<ClassBody>,
) -> ApiResult<Json<LockClass>> {
    if !state.authz.current().is_ns_admin(&ns, &caller.0) {
        return Err(forbidden(
            &caller,
            &format!("manage class {ns}/{class}"),
            "only admins of the namespace manage its classes",
        ));
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
    // On the namespace's tier, whose locker grants under it.
    state
        .ns_locker(&c.ns_id)
        .await?
        .config()
        .put_class(&c)
        .await?;
    Ok(Json(c))
}

/// The epoch record, and why grants are refused if they are.
#[derive(Serialize, ToSchema)]
pub(super) struct EpochView {
    #[serde(flatten)]
    record: palisade_api::EpochRecord,
    /// The highest grant revision this replica knows to be minted in this epoch: its own
    /// grants, and at least what the record confirmed when the replica loaded it (so a
    /// replica that minted nothing shows that, and a new epoch starts at etcd's revision
    /// then). `highest_grant_rev` is what the durable record confirms, and lags this by up
    /// to the reservation window; other replicas may have minted higher.
    #[schema(value_type = u64)]
    minted_rev: palisade_api::Revision,
    /// Why grants are refused, if they are.
    grants_refused: Option<String>,
}

/// The current epoch of a tier, the home tier by default (service admins only).
#[utoipa::path(get, path = routes::EPOCH, tag = "admin",
    params(EpochQuery),
    responses((status = 200, description = "the epoch", body = EpochView), ShowEpochProblems))]
pub(super) async fn show_epoch(
    State(state): State<AppState>,
    caller: Caller,
    QueryArgs(q): QueryArgs<EpochQuery>,
) -> ApiResult<Json<EpochView>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden(
            &caller,
            "see the epoch",
            "only service admins do",
        ));
    }
    let locker = match &q.tier {
        Some(tier) => {
            palisade_api::validate_name(tier)?;
            state.tiers.locker(tier)?
        }
        None => &state.locker,
    };
    let (record, mismatch) = locker.epoch();
    Ok(Json(EpochView {
        record,
        minted_rev: locker.minted_rev(),
        grants_refused: mismatch.map(|m| m.to_string()),
    }))
}

/// Starts a new epoch (service admins only); grants resume under it.
#[utoipa::path(post, path = routes::ADVANCE_EPOCH, tag = "admin",
    request_body = AdvanceBody,
    responses((status = 200, description = "the new epoch", body = EpochView), AdvanceEpochProblems))]
pub(super) async fn advance_epoch(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<AdvanceBody>,
) -> ApiResult<Json<EpochView>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden(
            &caller,
            "advance the epoch",
            "only service admins do",
        ));
    }
    let reason = match body.reason {
        AdvanceReason::Restore => EpochReason::Restore,
        AdvanceReason::Rehome => EpochReason::Rehome,
    };
    let tier = body
        .tier
        .unwrap_or_else(|| state.tiers.home_name().to_owned());
    palisade_api::validate_name(&tier)?;
    let record = state.tiers.advance_epoch(&tier, reason).await?;
    tracing::warn!(epoch = %record.epoch, tier, caller = caller.0.as_str(), "epoch advanced");
    Ok(Json(EpochView {
        record,
        minted_rev: state.tiers.locker(&tier)?.minted_rev(),
        grants_refused: None,
    }))
}

/// Moves a namespace to another etcd cluster tier (service admins only): fences it on
/// its tier (acquires there answer 503 `namespace-moving`), waits up to `drain_ms` for
/// its holds and waiters there to end, copies its classes, advances the new tier's
/// epoch above every tier's, switches the directory and lifts the new tier's fence.
/// A drain that times out rolls back (503 `namespace-moving`); running it again after
/// a failure resumes or finishes it.
#[utoipa::path(post, path = routes::REHOME, tag = "admin",
    params(("ns" = String, Path, description = "the namespace")),
    request_body = RehomeBody,
    responses((status = 200, description = "moved", body = RehomeView), RehomeProblems))]
pub(super) async fn rehome(
    State(state): State<AppState>,
    caller: Caller,
    PathArgs(ns): PathArgs<String>,
    Body(body): Body<RehomeBody>,
) -> ApiResult<Json<RehomeView>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden(
            &caller,
            &format!("rehome namespace {ns}"),
            "only service admins rehome namespaces",
        ));
    }
    palisade_api::validate_name(&ns)?;
    palisade_api::validate_name(&body.to)?;
    state.tiers.locker(&body.to)?;
    let drain = match body.drain_ms {
        None => palisade_lock::DEFAULT_DRAIN,
        Some(ms) if Duration::from_millis(ms) <= palisade_lock::MAX_DRAIN => {
            Duration::from_millis(ms)
        }
        Some(_) => {
            return Err(crate::problem::Problem::new(
                palisade_api::ProblemKind::InvalidInput,
                format!(
                    "drain_ms must be at most {}",
                    palisade_lock::MAX_DRAIN.as_millis()
                ),
            ))
        }
    };
    let done = state.tiers.rehome(&ns, &body.to, drain).await?;
    if done.from == done.to {
        // Idempotent: nothing moved (also the answer to a retried rehome that finished).
        tracing::info!(
            ns,
            tier = done.to,
            caller = caller.0.as_str(),
            "namespace already lives on the tier a rehome asked for"
        );
    } else {
        tracing::warn!(ns, from = done.from, to = done.to, epoch = %done.epoch.epoch,
            caller = caller.0.as_str(), "namespace rehomed");
    }
    Ok(Json(RehomeView {
        namespace: ns,
        from: done.from,
        to: done.to,
        epoch: done.epoch,
        removed_keys: done
            .removed
            .into_iter()
            .map(super::locks::foreign_view)
            .collect(),
    }))
}
