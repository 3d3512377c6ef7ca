//! [`PostgresEpochStore`]: the durable epoch record in PostgreSQL, shared by every locker
//! (process, replica) that serves one key space.

use std::sync::Arc;

use palisade_fence::{Epoch, Revision};

use super::record::{BoxFuture, EpochStore, StoreError};
use palisade_api::{EpochReason, EpochRecord};

/// The migrations that create the store's table (`lock_epoch`) and add its
/// `reserved_rev` column to a table created before it existed; idempotent.
pub const MIGRATION: &str = concat!(
    include_str!("../../migrations/0001_lock_epoch.sql"),
    include_str!("../../migrations/0004_lock_epoch_reserved.sql"),
);

/// An [`EpochStore`] in one row of the `lock_epoch` table, keyed by the locker's root
/// prefix. Several lockers on one etcd key space share it; every write is one atomic
/// max-merge statement (`INSERT ... ON CONFLICT ... DO UPDATE`), so the epoch never goes
/// down and, within an epoch, neither `highest_grant_rev` nor `reserved_rev` goes down,
/// whatever the order of concurrent writers. A row written before `reserved_rev`
/// existed (the column is NULL) loads with it equal to `highest_grant_rev`.
///
/// Run [`PostgresEpochStore::migrate`] (or [`MIGRATION`]) once before use.
#[derive(Clone)]
pub struct PostgresEpochStore {
    client: Arc<tokio_postgres::Client>,
    root: String,
}

impl std::fmt::Debug for PostgresEpochStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresEpochStore")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl PostgresEpochStore {
    /// A store on `client` (whose connection the caller drives) for the key space under
    /// `root` (the same string as [`LockerOptions::with_root`](crate::LockerOptions::with_root);
    /// a `/` is appended if missing).
    pub fn new(client: Arc<tokio_postgres::Client>, root: impl Into<String>) -> Self {
        let mut root = root.into();
        if !root.ends_with('/') {
            root.push('/');
        }
        PostgresEpochStore { client, root }
    }

    /// The store of tier `tier` of a [`Tiers`](crate::Tiers) deployment whose clusters
    /// share one database: the row keyed `<root>tier/<tier>/`, so each tier keeps its
    /// own record (the home tier may keep [`PostgresEpochStore::new`]'s row).
    pub fn for_tier(
        client: Arc<tokio_postgres::Client>,
        root: impl Into<String>,
        tier: &str,
    ) -> Self {
        let mut store = PostgresEpochStore::new(client, root);
        store.root = format!("{}tier/{tier}/", store.root);
        store
    }

    /// Creates the table if it does not exist.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute(MIGRATION).await
    }
}

fn reason_str(r: EpochReason) -> &'static str {
    match r {
        EpochReason::Bootstrap => "bootstrap",
        EpochReason::Restore => "restore",
        EpochReason::Rehome => "rehome",
    }
}

fn reason_from(s: &str) -> Result<EpochReason, StoreError> {
    match s {
        "bootstrap" => Ok(EpochReason::Bootstrap),
        "restore" => Ok(EpochReason::Restore),
        "rehome" => Ok(EpochReason::Rehome),
        other => Err(format!("unknown epoch reason {other:?}").into()),
    }
}

impl EpochStore for PostgresEpochStore {
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>> {
        Box::pin(async move {
            let row = self
                .client
                .query_opt(
                    "SELECT epoch, cluster_id, advanced_at_ms, reason, highest_grant_rev, \
                       reserved_rev \
                     FROM lock_epoch WHERE root = $1",
                    &[&self.root],
                )
                .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let epoch: i32 = row.try_get(0)?;
            let cluster_id: i64 = row.try_get(1)?;
            let advanced_at_ms: i64 = row.try_get(2)?;
            let reason: String = row.try_get(3)?;
            let highest: i64 = row.try_get(4)?;
            let highest = Revision::new(u64::try_from(highest)?);
            let reserved: Option<i64> = row.try_get(5)?;
            let reserved = match reserved {
                Some(r) => Revision::new(u64::try_from(r)?).max(highest),
                None => highest,
            };
            Ok(Some(EpochRecord {
                epoch: Epoch::new(u16::try_from(epoch)?)?,
                cluster_id: cluster_id as u64,
                advanced_at_ms: u64::try_from(advanced_at_ms)?,
                reason: reason_from(&reason)?,
                highest_grant_rev: highest,
                reserved_rev: reserved,
            }))
        })
    }

    fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            // A higher epoch replaces the row; a lower one changes nothing (the WHERE);
            // the same epoch keeps the greater highest_grant_rev and the greater
            // reserved_rev (a NULL one, from before the column, counts as highest_grant_rev).
            self.client
                .execute(
                    "INSERT INTO lock_epoch AS e \
                       (root, epoch, cluster_id, advanced_at_ms, reason, highest_grant_rev, \
                        reserved_rev) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) \
                     ON CONFLICT (root) DO UPDATE SET \
                       epoch = EXCLUDED.epoch, \
                       cluster_id = EXCLUDED.cluster_id, \
                       advanced_at_ms = EXCLUDED.advanced_at_ms, \
                       reason = EXCLUDED.reason, \
                       highest_grant_rev = CASE WHEN EXCLUDED.epoch = e.epoch \
                         THEN GREATEST(e.highest_grant_rev, EXCLUDED.highest_grant_rev) \
                         ELSE EXCLUDED.highest_grant_rev END, \
                       reserved_rev = CASE WHEN EXCLUDED.epoch = e.epoch \
                         THEN GREATEST(COALESCE(e.reserved_rev, e.highest_grant_rev), \
                                       EXCLUDED.reserved_rev) \
                         ELSE EXCLUDED.reserved_rev END, \
                       updated_at = now() \
                     WHERE EXCLUDED.epoch >= e.epoch",
                    &[
                        &self.root,
                        &i32::from(record.epoch.get()),
                        &(record.cluster_id as i64),
                        &i64::try_from(record.advanced_at_ms)?,
                        &reason_str(record.reason),
                        &i64::try_from(record.highest_grant_rev.get())?,
                        &i64::try_from(record.reserved_rev.get())?,
                    ],
                )
                .await?;
            Ok(())
        })
    }
}
