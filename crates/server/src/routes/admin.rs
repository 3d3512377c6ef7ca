//! Admin: namespaces, classes, the epoch.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::extract::{Body, PathArgs};
use super::{forbidden, ApiResult, AppState};
use crate::identity::Caller;
use crate::openapi::{
    AdvanceEpochProblems, ListClassesProblems, ListNamespacesProblems, PutClassProblems,
    PutNamespaceProblems, ShowEpochProblems,
};
use palisade_api::routes;
use palisade_api::wire::{AdvanceBody, AdvanceReason, ClassBody, NamespaceBody};
use palisade_api::EpochReason;
use palisade_api::{LockClass, Namespace};

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
        return Err(forbidden("only admins of the namespace list its classes"));
    }
    Ok(Json(state.locker.config().classes(&ns).await?))
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

/// The current epoch (service admins only).
#[utoipa::path(get, path = routes::EPOCH, tag = "admin",
    responses((status = 200, description = "the epoch", body = EpochView), ShowEpochProblems))]
pub(super) async fn show_epoch(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<EpochView>> {
    if !state.authz.current().is_admin(&caller.0) {
        return Err(forbidden("only service admins see the epoch"));
    }
    let (record, mismatch) = state.locker.epoch();
    Ok(Json(EpochView {
        record,
        minted_rev: state.locker.minted_rev(),
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
        minted_rev: state.locker.minted_rev(),
        grants_refused: None,
    }))
}
