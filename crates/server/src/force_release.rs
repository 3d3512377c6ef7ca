//! Two-person force release: requests in PostgreSQL, approval by a second admin, the
//! record handed to a [`ForceReleaseAudit`].
//!
//! # Force release, by two people
//!
//! Needs [`ServiceOptions::with_force_releases`] (a PostgreSQL table of requests,
//! [`FORCE_RELEASE_MIGRATION`], and a [`ForceReleaseAudit`] sink); without it the routes
//! are 404. An admin of the namespace requests the release of a lock key with a reason
//! (reason: 1 to 1024 bytes, not blank, no control or bidirectional formatting character); a *different* admin approves it: the requester approving
//! their own request is 403 `forbidden`, a second approval 409 `already-approved` (the
//! approval is one conditional `UPDATE`, so only one replica wins).
//!
//! **A request names the grants it is about, fixed when it is made.** The holds of the
//! key at request time (or the one hold named by `grant_rev` or `token`) are read from
//! etcd and stored with the request as its *targets*; a key with no holder, or a named
//! hold that does not exist, is 409 `not-held` and no request is made. On approval each
//! target is deleted by a Txn that compares its exact grant revision
//! ([`Locker::force_release_grant`]), so a hold granted after the request (the holder
//! released and acquired again) is never touched. An approval that finds every target
//! gone or replaced releases nothing and answers 409 `force-target-gone`; the request
//! is then closed. Each deletion is recorded through the [`ForceReleaseAudit`] with the
//! grant it ended (grant revision and token), the revision of its Txn, requester,
//! approver, reason and whether the class was fenced.
//!
//! **The forced holder is told.** The force Txn puts a notice on the holder's session
//! (see `palisade_api::keys`): its next keepalive answers with the hold in `forced`, a
//! release of it answers 409 `hold-forced`, and the Rust client's `RemoteHold::lost`
//! fires.
//!
//! etcd calls of an approval go through the shared retry (a dead member is left for
//! the others). If etcd or the database still fails after the approval is recorded, the
//! answer is the failure (503, 502...) and the request stays approved but not executed:
//! approving it again (the approver or another admin of the namespace, never the
//! requester) deletes the targets that remain, each at most once, and records each in
//! the audit trail once (a target an earlier attempt deleted is recognised by the force
//! marker with this request's id in its grant record, and recorded if it was not yet).
//! Only an executed request answers 409 `already-approved`. The request table is used
//! through a connection pool (deadpool-postgres); a statement whose connection the
//! server ended is run again on another connection.
//!
//! **The window after a force release.** The deleted holder's token is still the highest
//! any resource has seen until the *next* holder writes with its (higher) token. Until
//! then a fenced resource cannot tell the old holder is gone and still admits its
//! writes: fencing refuses a token only once a newer one has been seen. The class's
//! lock-delay keeps the next grant back (no one is granted the lock for `lock_delay`
//! after the forced delete), which gives the old holder time to notice the loss (its
//! keepalive lists the hold as forced) before anyone else writes; it does not stop the
//! old holder from writing in that window. Once the next holder has written with its
//! token, every resource it wrote to refuses the old token (409 `stale`).
//!
//! [`ServiceOptions::with_force_releases`]: crate::ServiceOptions::with_force_releases
//! [`Locker::force_release_grant`]: palisade_lock::Locker::force_release_grant

use std::sync::Arc;
use std::time::SystemTime;

use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};

use palisade_api::{FencingToken, Revision};
use palisade_api::{LeaseId, Mode};
use palisade_lock::BoxFuture;

/// The migrations of the `force_release_request` table; idempotent.
pub const FORCE_RELEASE_MIGRATION: &str = concat!(
    include_str!("../migrations/0002_force_release_request.sql"),
    include_str!("../migrations/0003_force_release_execution.sql")
);

/// The advisory lock key that serializes [`ForceReleases::migrate`] across processes
/// ("pfrr").
const MIGRATION_LOCK_KEY: i64 = 0x7066_7272;

/// One hold deleted by an approved force release, as the audit trail records it.
///
/// A request that deletes several holds (a shared lock) yields one record per hold:
/// the hold at index 0 of the request's targets has the request's id, the one at index
/// n ≥ 1 `<id>.<n>`, so `request_id` stays unique, also across retried approvals.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// The request's id (with `.<n>` for the second and later holds).
    pub request_id: String,
    /// The etcd cluster id of `revision`.
    pub cluster_id: u64,
    /// The revision of the Txn that deleted the hold.
    pub revision: Revision,
    /// The revision of the Txn that granted the deleted hold.
    pub grant_rev: Revision,
    /// The deleted hold's token.
    pub token: FencingToken,
    /// The lock key within its class.
    pub lock_key: String,
    /// Who requested it (SPIFFE ID).
    pub requester: String,
    /// Who approved it (SPIFFE ID; never the requester).
    pub approver: String,
    /// Why, in the requester's words.
    pub reason: String,
    /// Whether the class was fenced at the time.
    pub class_was_fenced: bool,
    /// When the hold was deleted.
    pub at: SystemTime,
}

/// Where approved force releases are recorded (the audit database). The lock crate
/// cannot depend on the audit crate (which depends on it), so the binary wiring
/// implements this over the audit store.
pub trait ForceReleaseAudit: Send + Sync + 'static {
    /// Records one forced release. Called after the hold was deleted; an error is
    /// reported to the approver as a 500 problem, the hold stays deleted.
    fn record(
        &self,
        release: ForcedRelease,
    ) -> BoxFuture<'_, Result<(), Box<dyn std::error::Error + Send + Sync>>>;
}

/// A failure of the force release request table.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForceDbError {
    /// No connection could be had from the pool.
    #[error("no database connection")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The database answered with an error.
    #[error("database error")]
    Postgres(#[from] tokio_postgres::Error),
    /// A stored target list could not be read.
    #[error("corrupt force release targets")]
    CorruptTargets(#[from] serde_json::Error),
}

/// The two-person force release of a service: the request table and the audit sink.
#[derive(Clone)]
pub struct ForceReleases {
    pool: Pool,
    pub(super) audit: Arc<dyn ForceReleaseAudit>,
}

impl std::fmt::Debug for ForceReleases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForceReleases").finish_non_exhaustive()
    }
}

impl ForceReleases {
    /// Requests kept in the `force_release_request` table, through connections of
    /// `pool`; approved releases recorded in `audit`. A statement that fails because its
    /// connection was closed or ended by the server is run again on another connection,
    /// up to three times in all (a statement the server ended was not committed).
    pub fn new(pool: Pool, audit: Arc<dyn ForceReleaseAudit>) -> Self {
        ForceReleases { pool, audit }
    }

    /// Creates or completes the request table ([`FORCE_RELEASE_MIGRATION`]). Safe to run
    /// from several replicas starting at once: the statements run in one transaction
    /// under a transaction-scoped advisory lock (concurrent `CREATE TABLE IF NOT EXISTS`
    /// of one table can otherwise fail on PostgreSQL's catalog unique index).
    ///
    /// # Errors
    ///
    /// [`ForceDbError`].
    pub async fn migrate(&self) -> Result<(), ForceDbError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
            .await?;
        tx.batch_execute(FORCE_RELEASE_MIGRATION).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// One hold a request is about, to be deleted on approval.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Target {
    pub(super) lease: LeaseId,
    pub(super) mode: Mode,
    pub(super) grant_rev: Revision,
    pub(super) token: FencingToken,
}

impl Target {
    pub(super) fn view(&self) -> palisade_api::wire::ForceTargetView {
        palisade_api::wire::ForceTargetView {
            session: self.lease.to_string(),
            mode: self.mode,
            grant_rev: self.grant_rev,
            token: self.token,
        }
    }
}

/// A stored request.
pub(super) struct StoredRequest {
    pub(super) namespace: String,
    pub(super) class: String,
    pub(super) key: String,
    pub(super) requester: String,
    pub(super) reason: String,
    pub(super) approver: Option<String>,
    pub(super) targets: Option<Vec<Target>>,
    pub(super) executed: bool,
}

/// Whether `e` says the connection, not the statement, failed: closed, or ended by the
/// server (`pg_terminate_backend`, a restart: SQLSTATE 57P01..57P03). Classified by
/// SQLSTATE, never by message text.
fn connection_gone(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.is_closed()
        || e.code().is_some_and(|c| {
            [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(c)
        })
}

/// Runs `$body` with a pooled client bound to `$c`; up to twice more, each time on
/// another connection, while the connection turns out gone (the pool may still hold
/// other connections the server ended at the same time).
macro_rules! with_client {
    ($self:ident, |$c:ident| $body:expr) => {{
        let mut attempt = 0;
        loop {
            attempt += 1;
            let $c = $self.pool.get().await?;
            match $body.await {
                Err(e) if attempt < 3 && connection_gone(&e) => {
                    tracing::warn!(error = %e, "force release database connection closed; retrying");
                    // Not returned to the pool: it is dead.
                    let _ = deadpool_postgres::Object::take($c);
                }
                other => break other.map_err(ForceDbError::from),
            }
        }
    }};
}

impl ForceReleases {
    /// Stores a new request with its `targets` (the holds it is about); its id.
    pub(super) async fn insert(
        &self,
        ns: &str,
        class: &str,
        key: &str,
        requester: &str,
        reason: &str,
        targets: &[Target],
    ) -> Result<String, ForceDbError> {
        let targets = serde_json::to_string(targets)?;
        let row = with_client!(self, |c| {
            c.query_one(
            "INSERT INTO force_release_request (id, namespace, class, key, requester, reason, targets) \
             VALUES (gen_random_uuid()::text, $1, $2, $3, $4, $5, $6) RETURNING id",
            &[&ns, &class, &key, &requester, &reason, &targets],
        )
        })?;
        Ok(row.get(0))
    }

    pub(super) async fn get(&self, id: &str) -> Result<Option<StoredRequest>, ForceDbError> {
        let row = with_client!(self, |c| c.query_opt(
            "SELECT namespace, class, key, requester, reason, approver, targets, \
             executed_at IS NOT NULL FROM force_release_request WHERE id = $1",
            &[&id],
        ))?;
        let Some(r) = row else { return Ok(None) };
        let targets: Option<String> = r.get(6);
        Ok(Some(StoredRequest {
            namespace: r.get(0),
            class: r.get(1),
            key: r.get(2),
            requester: r.get(3),
            reason: r.get(4),
            approver: r.get(5),
            targets: targets.map(|t| serde_json::from_str(&t)).transpose()?,
            executed: r.get(7),
        }))
    }

    /// Marks the request approved by `approver` if it is still pending and `approver` is
    /// not its requester; whether this call did it (one approval wins across replicas).
    pub(super) async fn claim(&self, id: &str, approver: &str) -> Result<bool, ForceDbError> {
        let n = with_client!(self, |c| c.execute(
            "UPDATE force_release_request SET approver = $2, approved_at = now() \
             WHERE id = $1 AND approver IS NULL AND requester <> $2",
            &[&id, &approver],
        ))?;
        Ok(n == 1)
    }

    /// Stores `targets` unless the request already has a list; the stored list.
    pub(super) async fn fix_targets(
        &self,
        id: &str,
        targets: &[Target],
    ) -> Result<Vec<Target>, ForceDbError> {
        let json = serde_json::to_string(targets)?;
        let row = with_client!(self, |c| c.query_one(
            "UPDATE force_release_request SET targets = COALESCE(targets, $2) \
             WHERE id = $1 RETURNING targets",
            &[&id, &json],
        ))?;
        let stored: String = row.get(0);
        Ok(serde_json::from_str(&stored)?)
    }

    /// Records that every target was handled.
    pub(super) async fn mark_executed(&self, id: &str) -> Result<(), ForceDbError> {
        with_client!(self, |c| c.execute(
            "UPDATE force_release_request SET executed_at = COALESCE(executed_at, now()) \
             WHERE id = $1",
            &[&id],
        ))?;
        Ok(())
    }
}
