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
/// [`MAX_REASON_LEN`](palisade_api::MAX_REASON_LEN) bytes, not blank, no control or
/// bidirectional formatting character, the ones lock keys refuse
/// ([`palisade_api::validate_text`]).
pub(super) fn check_reason(reason: &str) -> ApiResult<()> {
    Ok(palisade_api::validate_text(
        "reason",
        reason,
        palisade_api::MAX_REASON_LEN,
    )?)
}

/// Requests a force release (admins of the namespace); nothing is deleted yet. The
/// request is about the holds of the key now (or the one named by `grant_rev` or
/// `token`), stored with it as its targets.
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
            &caller,
            &format!(
                "request a force release of {}/{}/{}",
                body.namespace, body.class, body.key
            ),
            "only admins of the namespace request force releases",
        ));
    }
    let name = LockName::new(body.namespace.clone(), body.class.clone(), body.key.clone());
    let locker = state.ns_locker(&body.namespace).await?;
    // An unknown class is 404, a key outside its prefix 400: the lock cannot exist.
    let class = locker.config().class(&body.namespace, &body.class).await?;
    if !body.key.starts_with(&class.key_prefix) {
        return Err(Problem::new(
            ProblemKind::InvalidInput,
            format!(
                "key {:?} is outside class {}'s key prefix {:?}",
                body.key, body.class, class.key_prefix
            ),
        ));
    }
    let lock = locker.lock_state(&name).await?;
    let targets: Vec<Target> = lock
        .holders
        .into_iter()
        .filter(|h| body.grant_rev.is_none_or(|r| r == h.grant_rev))
        .filter(|h| body.token.is_none_or(|t| t == h.token))
        .map(|h| Target {
            lease: h.lease,
            mode: h.mode,
            grant_rev: h.grant_rev,
            token: h.token,
        })
        .collect();
    if targets.is_empty() {
        let lock = format!("{}/{}/{}", body.namespace, body.class, body.key);
        let detail = match (body.grant_rev, body.token) {
            (None, None) => format!("lock {lock} has no holder"),
            (Some(r), None) => format!("no hold of lock {lock} was granted at revision {r}"),
            (None, Some(t)) => format!("no hold of lock {lock} has token {t}"),
            (Some(r), Some(t)) => {
                format!("no hold of lock {lock} was granted at revision {r} with token {t}")
            }
        };
        return Err(Problem::new(ProblemKind::NotHeld, detail));
    }
    let id = force
        .insert(
            &body.namespace,
            &body.class,
            &body.key,
            caller.0.as_str(),
            &body.reason,
            &targets,
        )
        .await
        .map_err(|e| db_problem(&e))?;
    tracing::warn!(%id, requester = caller.0.as_str(), ns = %body.namespace, class = %body.class, key = %body.key, targets = targets.len(), "force release requested");
    Ok((
        StatusCode::CREATED,
        Json(ForceRequestView {
            id,
            namespace: body.namespace,
            class: body.class,
            key: body.key,
            requester: caller.0.as_str().to_owned(),
            reason: body.reason,
            targets: targets.iter().map(Target::view).collect(),
        }),
    ))
}

/// Approves a force release (a different admin of the namespace): the holds the request
/// named are deleted, if they are still held, and recorded in the audit trail. If every
/// one of them is gone or replaced, nothing is deleted: 409 `force-target-gone`. If
/// etcd or the database fails part way, the request stays approved but not executed,
/// and approving it again (any admin of the namespace but the requester) finishes it,
/// deleting each target at most once.
#[utoipa::path(post, path = routes::APPROVE_FORCE_RELEASE, tag = "force release",
    params(("id" = String, Path, description = "the request id (1 to 64 bytes, no control character)",
        max_length = 64, pattern = r"^[^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*[^\u0000-\u0020\u007f-\u00a0\u061c\u1680\u2000-\u200a\u200e\u200f\u2028\u2029\u202a-\u202f\u205f\u2066-\u2069\u3000\ufeff][^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$")),
    responses((status = 200, description = "approved and executed (`released`: the holds deleted)",
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
    palisade_api::validate_text("id", &id, palisade_api::MAX_REQUEST_ID_LEN)?;
    let db = |e: ForceDbError| db_problem(&e);
    let mut req = force.get(&id).await.map_err(db)?.ok_or_else(not_found)?;
    if !state.authz.current().is_ns_admin(&req.namespace, &caller.0) {
        return Err(forbidden(
            &caller,
            &format!("approve force release {id} in namespace {}", req.namespace),
            "only admins of the namespace approve force releases",
        ));
    }
    if req.requester == caller.0.as_str() {
        return Err(forbidden(
            &caller,
            &format!("approve force release {id}"),
            "a force release needs a second admin: the requester cannot approve it",
        ));
    }
    if req.approver.is_none() && !force.claim(&id, caller.0.as_str()).await.map_err(db)? {
        // Another approval won the race: go on with what it recorded.
        req = force.get(&id).await.map_err(db)?.ok_or_else(not_found)?;
    }
    if req.executed {
        return Err(Problem::new(
            ProblemKind::AlreadyApproved,
            "this request was already approved and executed",
        ));
    }
    let approver = req
        .approver
        .clone()
        .unwrap_or_else(|| caller.0.as_str().to_owned());
    let locker = state.ns_locker(&req.namespace).await?;
    let class = locker.config().class(&req.namespace, &req.class).await?;
    let class_was_fenced = class.enforcement == Enforcement::Fenced;
    let name = LockName::new(req.namespace, req.class, req.key);
    let targets = match req.targets {
        Some(t) => t,
        // A request stored before targets were fixed at request time: the holds now.
        None => {
            let lock = locker.lock_state(&name).await?;
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
    let cluster_id = locker.epoch().0.cluster_id;
    let mut released = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let revision = match locker
            .force_release_grant(&name, t.lease, t.mode, t.grant_rev, &marker)
            .await
        {
            Ok(rev) => rev,
            // Gone: deleted by an earlier attempt of this request (its grant record
            // carries this request's marker), or released, expired or replaced since.
            Err(e) if e.is_not_held() => {
                match locker.forced_by(&name, t.lease, t.mode, &id).await? {
                    Some(rev) => rev,
                    None => continue,
                }
            }
            Err(e) => return Err(e.into()),
        };
        let request_id = if i == 0 {
            id.clone()
        } else {
            format!("{id}.{i}")
        };
        tracing::warn!(%request_id, %revision, grant_rev = %t.grant_rev, requester = %req.requester, approver = %approver, "hold force-released");
        force
            .audit
            .record(ForcedRelease {
                request_id,
                cluster_id,
                revision,
                grant_rev: t.grant_rev,
                token: t.token,
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
            grant_rev: t.grant_rev,
            revision,
        });
    }
    force.mark_executed(&id).await.map_err(db)?;
    if released.is_empty() {
        return Err(Problem::new(
            ProblemKind::ForceTargetGone,
            "every hold the request named was released, expired or granted anew since it was made: nothing was released",
        ));
    }
    Ok(Json(ApproveView {
        id,
        requester: req.requester,
        approver,
        class_was_fenced,
        released,
    }))
}
