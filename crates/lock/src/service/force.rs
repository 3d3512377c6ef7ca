//! Two-person force release: requests in PostgreSQL, approval by a second admin, the
//! record handed to a [`ForceReleaseAudit`].

use std::sync::Arc;
use std::time::SystemTime;

use crate::epoch::BoxFuture;
use crate::Revision;

/// The migration that creates the `force_release_request` table; idempotent.
pub const FORCE_RELEASE_MIGRATION: &str =
    include_str!("../../migrations/0002_force_release_request.sql");

/// One hold deleted by an approved force release, as the audit trail records it.
///
/// A request that deletes several holds (a shared lock) yields one record per hold:
/// the first hold's record has the request's id, the n-th (n ≥ 1) `<id>.<n>`, so
/// `request_id` stays unique.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// The request's id (with `.<n>` for the second and later holds).
    pub request_id: String,
    /// The etcd cluster id of `revision`.
    pub cluster_id: u64,
    /// The revision of the Txn that deleted the hold.
    pub revision: Revision,
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

/// The two-person force release of a service: the request table and the audit sink.
#[derive(Clone)]
pub struct ForceReleases {
    pub(super) client: Arc<tokio_postgres::Client>,
    pub(super) audit: Arc<dyn ForceReleaseAudit>,
}

impl std::fmt::Debug for ForceReleases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForceReleases").finish_non_exhaustive()
    }
}

impl ForceReleases {
    /// Requests kept in the `force_release_request` table through `client` (whose
    /// connection the caller drives); approved releases recorded in `audit`.
    pub fn new(client: Arc<tokio_postgres::Client>, audit: Arc<dyn ForceReleaseAudit>) -> Self {
        ForceReleases { client, audit }
    }

    /// Creates the request table if it does not exist ([`FORCE_RELEASE_MIGRATION`]).
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute(FORCE_RELEASE_MIGRATION).await
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
}

impl ForceReleases {
    pub(super) async fn insert(
        &self,
        ns: &str,
        class: &str,
        key: &str,
        requester: &str,
        reason: &str,
    ) -> Result<String, tokio_postgres::Error> {
        let row = self
            .client
            .query_one(
                "INSERT INTO force_release_request (id, namespace, class, key, requester, reason) \
                 VALUES (gen_random_uuid()::text, $1, $2, $3, $4, $5) RETURNING id",
                &[&ns, &class, &key, &requester, &reason],
            )
            .await?;
        Ok(row.get(0))
    }

    pub(super) async fn get(
        &self,
        id: &str,
    ) -> Result<Option<StoredRequest>, tokio_postgres::Error> {
        let row = self
            .client
            .query_opt(
                "SELECT namespace, class, key, requester, reason, approver \
                 FROM force_release_request WHERE id = $1",
                &[&id],
            )
            .await?;
        Ok(row.map(|r| StoredRequest {
            namespace: r.get(0),
            class: r.get(1),
            key: r.get(2),
            requester: r.get(3),
            reason: r.get(4),
            approver: r.get(5),
        }))
    }

    /// Marks the request approved by `approver` if it is still pending and `approver` is
    /// not its requester; whether this call did it (one approval wins across replicas).
    pub(super) async fn claim(
        &self,
        id: &str,
        approver: &str,
    ) -> Result<bool, tokio_postgres::Error> {
        let n = self
            .client
            .execute(
                "UPDATE force_release_request SET approver = $2, approved_at = now() \
                 WHERE id = $1 AND approver IS NULL AND requester <> $2",
                &[&id, &approver],
            )
            .await?;
        Ok(n == 1)
    }
}
