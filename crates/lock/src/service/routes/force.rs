//! Two-person force release: request, approve.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{Body, PathArgs};
use super::{forbidden, ApiResult, AppState};
use crate::locker::LockName;
use crate::model::{Enforcement, Mode};
use crate::service::force::{ForceDbError, ForceReleases, ForcedRelease, Target};
use crate::service::identity::Caller;
use crate::service::openapi::{ApproveForceProblems, RequestForceProblems};
use crate::service::problem::{Problem, ProblemKind};
use crate::{FencingToken, Revision};

fn force_of(state: &AppState) -> ApiResult<&ForceReleases> {
    state.force.as_ref().ok_or_else(|| {
        Problem::new(
            ProblemKind::NotFound,
            "force release is not configured on this service (no database)",
        )
    })
}

fn db_problem(e: &ForceDbError) -> Problem {
    tracing::error!(error = ?e, "force release database error");
    Problem::new(ProblemKind::Upstream, "the force release database failed")
}

/// The longest force release reason, in bytes.
const MAX_REASON_LEN: usize = 1024;

/// Requests the force release of a lock key.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ForceRequestBody {
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    namespace: String,
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    class: String,
    #[schema(min_length = 1, max_length = 512)]
    key: String,
    /// Why, 1 to 1024 bytes, not blank.
    #[schema(min_length = 1, max_length = 1024)]
    reason: String,
}

/// The `reason` of a [`ForceRequestBody`]: 1 to [`MAX_REASON_LEN`] bytes, not blank.
pub(super) fn check_reason(reason: &str) -> ApiResult<()> {
    if reason.trim().is_empty() || reason.len() > MAX_REASON_LEN {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!("reason must be 1 to {MAX_REASON_LEN} bytes, not blank"),
        ));
    }
    Ok(())
}

/// A pending force release request.
#[derive(Serialize, ToSchema)]
pub(super) struct ForceRequestView {
    /// The request id, to approve it with.
    id: String,
    namespace: String,
    class: String,
    key: String,
    requester: String,
    reason: String,
}

/// Requests a force release (admins of the namespace); nothing is deleted yet.
#[utoipa::path(post, path = "/v1/force-releases", tag = "force release",
    request_body = ForceRequestBody,
    responses((status = 201, description = "requested; a different admin must approve it",
        body = ForceRequestView), RequestForceProblems))]
pub(super) async fn request_force_release(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<ForceRequestBody>,
) -> ApiResult<impl IntoResponse> {
    let force = force_of(&state)?;
    crate::model::validate_name(&body.namespace)?;
    crate::model::validate_name(&body.class)?;
    crate::keys::validate_key(&body.key)?;
    check_reason(&body.reason)?;
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

/// One hold deleted by an approval.
#[derive(Serialize, ToSchema)]
pub(super) struct ReleasedView {
    session: String,
    mode: Mode,
    /// The deleted hold's token, a decimal u64 as a string.
    #[schema(value_type = String)]
    token: FencingToken,
    /// The revision of the Txn that deleted it.
    #[schema(value_type = u64)]
    revision: Revision,
}

/// An approved force release.
#[derive(Serialize, ToSchema)]
pub(super) struct ApproveView {
    id: String,
    requester: String,
    approver: String,
    class_was_fenced: bool,
    /// The holds deleted (empty if the lock had no holder).
    released: Vec<ReleasedView>,
}

/// Approves a force release (a different admin of the namespace): every current hold
/// of the key is deleted and recorded in the audit trail. If that fails part way (etcd
/// or the database unavailable), the request stays approved but not executed, and
/// approving it again (any admin of the namespace but the requester) finishes it,
/// deleting each hold the first approval found at most once.
#[utoipa::path(post, path = "/v1/force-releases/{id}/approve", tag = "force release",
    params(("id" = String, Path, description = "the request id")),
    responses((status = 200, description = "approved and executed (`released`: the holds this call deleted)",
        body = ApproveView), ApproveForceProblems))]
pub(super) async fn approve_force_release(
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
    let already = || {
        Problem::new(
            ProblemKind::AlreadyApproved,
            "this request was already approved and executed",
        )
    };
    if id.is_empty() || id.len() > 64 {
        return Err(not_found());
    }
    let db = |e: ForceDbError| db_problem(&e);
    let mut req = force.get(&id).await.map_err(db)?.ok_or_else(not_found)?;
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
    if req.approver.is_none() && !force.claim(&id, caller.0.as_str()).await.map_err(db)? {
        // Another approval won the race: go on with what it recorded.
        req = force.get(&id).await.map_err(db)?.ok_or_else(not_found)?;
    }
    if req.executed {
        return Err(already());
    }
    let approver = req
        .approver
        .clone()
        .unwrap_or_else(|| caller.0.as_str().to_owned());
    let class = state
        .locker
        .config()
        .class(&req.namespace, &req.class)
        .await?;
    let class_was_fenced = class.enforcement == Enforcement::Fenced;
    let name = LockName::new(req.namespace, req.class, req.key);
    let targets = match req.targets {
        Some(t) => t,
        None => {
            let lock = state.locker.lock_state(&name).await?;
            let found: Vec<Target> = lock
                .holders
                .into_iter()
                .map(|h| Target {
                    lease: h.lease,
                    mode: h.mode,
                    grant_rev: h.grant_rev,
                    token: h.token,
                })
                .collect();
            force.fix_targets(&id, &found).await.map_err(db)?
        }
    };
    let marker = crate::force::ForceMarker {
        request_id: id.clone(),
        requester: req.requester.clone(),
        reason: req.reason.clone(),
    };
    let cluster_id = state.locker.epoch().0.cluster_id;
    let mut released = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let revision = match state
            .locker
            .force_release_grant(&name, t.lease, t.mode, t.grant_rev, &marker)
            .await
        {
            Ok(rev) => rev,
            // Deleted by an earlier attempt, or released or expired since: nothing to do.
            Err(e) if e.kind() == &crate::error::ErrorKind::NotHeld => continue,
            Err(e) => return Err(e.into()),
        };
        let request_id = if i == 0 {
            id.clone()
        } else {
            format!("{id}.{i}")
        };
        tracing::warn!(%request_id, %revision, requester = %req.requester, approver = %approver, "hold force-released");
        force
            .audit
            .record(ForcedRelease {
                request_id,
                cluster_id,
                revision,
                lock_key: name.key.clone(),
                requester: req.requester.clone(),
                approver: approver.clone(),
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
            session: t.lease.to_string(),
            mode: t.mode,
            token: t.token,
            revision,
        });
    }
    force.mark_executed(&id).await.map_err(db)?;
    Ok(Json(ApproveView {
        id,
        requester: req.requester,
        approver,
        class_was_fenced,
        released,
    }))
}
