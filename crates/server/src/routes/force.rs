//! Two-person force release: request, approve.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::extract::{Body, PathArgs};
use super::{forbidden, ApiResult, AppState};
use crate::force_release::{ForceDbError, ForceReleases, ForcedRelease, Target};
use crate::identity::Caller;
use crate::openapi::{ApproveForceProblems, RequestForceProblems};
use crate::problem::Problem;
use palisade_api::routes;
use palisade_api::wire::{ApproveView, ForceRequestBody, ForceRequestView, ReleasedView};
use palisade_api::Enforcement;
use palisade_api::ProblemKind;
use palisade_lock::LockName;

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

/// The `reason` of a [`ForceRequestBody`]: text of 1 to
/// [`MAX_REASON_LEN`](palisade_api::MAX_REASON_LEN) bytes, not blank, no control
/// character ([`palisade_api::validate_text`]).
pub(super) fn check_reason(reason: &str) -> ApiResult<()> {
    Ok(palisade_api::validate_text(
        "reason",
        reason,
        palisade_api::MAX_REASON_LEN,
    )?)
}

/// Requests a force release (admins of the namespace); nothing is deleted yet.
#[utoipa::path(post, path = routes::FORCE_RELEASES, tag = "force release",
    request_body = ForceRequestBody,
    responses((status = 201, description = "requested; a different admin must approve it",
        body = ForceRequestView), RequestForceProblems))]
pub(super) async fn request_force_release(
    State(state): State<AppState>,
    caller: Caller,
    Body(body): Body<ForceRequestBody>,
) -> ApiResult<impl IntoResponse> {
    let force = force_of(&state)?;
    palisade_api::validate_name(&body.namespace)?;
    palisade_api::validate_name(&body.class)?;
    palisade_api::validate_key(&body.key)?;
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

/// Approves a force release (a different admin of the namespace): every current hold
/// of the key is deleted and recorded in the audit trail. If that fails part way (etcd
/// or the database unavailable), the request stays approved but not executed, and
/// approving it again (any admin of the namespace but the requester) finishes it,
/// deleting each hold the first approval found at most once.
#[utoipa::path(post, path = routes::APPROVE_FORCE_RELEASE, tag = "force release",
    params(("id" = String, Path, description = "the request id (1 to 64 bytes, no control character)",
        max_length = 64, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*[^\u0000-\u0020\u007f-\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff][^\u0000-\u001f\u007f-\u009f]*$")),
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
    palisade_api::validate_text("id", &id, palisade_api::MAX_REQUEST_ID_LEN)?;
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
    let marker = palisade_api::keys::ForceMarker {
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
            Err(e) if e.kind() == &palisade_lock::ErrorKind::NotHeld => continue,
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
