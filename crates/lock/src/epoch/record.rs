//! The epoch record, the durable store's contract, and the max-merge every store keeps.

use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use palisade_fence::{Epoch, Revision};
use serde::{Deserialize, Serialize};

/// A boxed, sendable future, as returned by [`EpochStore`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error type of an [`EpochStore`].
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// Why an epoch was started.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpochReason {
    /// The first epoch of an empty key space.
    Bootstrap,
    /// etcd was restored from a snapshot.
    Restore,
    /// The namespace moved to another etcd cluster.
    Rehome,
}

/// One epoch record, as stored in etcd (`config/epoch`) and in the durable store.
///
/// A record stored before `reserved_rev` existed loads with `reserved_rev` equal to
/// `highest_grant_rev`.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredRecord")]
pub struct EpochRecord {
    /// The epoch.
    #[cfg_attr(feature = "service", schema(value_type = u16))]
    pub epoch: Epoch,
    /// The etcd cluster id serving it (from response headers).
    pub cluster_id: u64,
    /// When it started, milliseconds since the Unix epoch.
    pub advanced_at_ms: u64,
    /// Why it started.
    pub reason: EpochReason,
    /// The highest grant revision known to be issued in this epoch (confirmed; durable
    /// store only, and it lags the tokens handed out by up to the reservation window;
    /// etcd's copy carries the revision etcd was at when the epoch started).
    #[cfg_attr(feature = "service", schema(value_type = u64))]
    pub highest_grant_rev: Revision,
    /// The reservation: the highest grant revision a token may be minted for in this
    /// epoch without another durable write (durable store only; etcd's copy carries the
    /// same value as `highest_grant_rev`). Never below `highest_grant_rev`. See
    /// [the epoch policy](crate#epochs).
    #[cfg_attr(feature = "service", schema(value_type = u64))]
    pub reserved_rev: Revision,
}

/// The stored shape of [`EpochRecord`], which also reads records written before
/// `reserved_rev` existed (a missing reservation is the confirmed revision).
#[derive(Deserialize)]
struct StoredRecord {
    epoch: Epoch,
    cluster_id: u64,
    advanced_at_ms: u64,
    reason: EpochReason,
    highest_grant_rev: Revision,
    #[serde(default)]
    reserved_rev: Option<Revision>,
}

impl From<StoredRecord> for EpochRecord {
    fn from(r: StoredRecord) -> Self {
        EpochRecord {
            epoch: r.epoch,
            cluster_id: r.cluster_id,
            advanced_at_ms: r.advanced_at_ms,
            reason: r.reason,
            highest_grant_rev: r.highest_grant_rev,
            reserved_rev: r
                .reserved_rev
                .unwrap_or(r.highest_grant_rev)
                .max(r.highest_grant_rev),
        }
    }
}

impl EpochRecord {
    pub(crate) fn new(
        epoch: Epoch,
        cluster_id: u64,
        reason: EpochReason,
        revision: Revision,
    ) -> Self {
        let advanced_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        EpochRecord {
            epoch,
            cluster_id,
            advanced_at_ms,
            reason,
            highest_grant_rev: revision,
            reserved_rev: revision,
        }
    }
}

/// The durable record outside etcd: [`FileEpochStore`](crate::FileEpochStore) (one host) or
/// `PostgresEpochStore` (feature `postgres`, shared by replicas).
///
/// `store` must be durable when its future completes. A locker writes it at start, when
/// an epoch is advanced, and when it raises its reservation (about once per half
/// reservation window of etcd revisions; see [the epoch policy](crate#epochs)), not on
/// every grant.
pub trait EpochStore: Send + Sync + 'static {
    /// Loads the record, or `None` if none was ever stored.
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>>;
    /// Merges `record` into the stored one durably, never lowering it: a record with a
    /// higher epoch replaces it, a lower epoch changes nothing, and within one epoch
    /// `highest_grant_rev` and `reserved_rev` each only rise (each the max of the stored
    /// and the new value). Concurrent writers (other lockers sharing the store) must not
    /// be able to lower them either.
    fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>>;
}

impl<T: EpochStore> EpochStore for std::sync::Arc<T> {
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>> {
        (**self).load()
    }
    fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        (**self).store(record)
    }
}

/// The max-merge of a stored record and a new one: a higher epoch replaces the record; a
/// lower epoch changes nothing; the same epoch keeps the higher `highest_grant_rev` and
/// the higher `reserved_rev`.
pub(crate) fn merge(stored: Option<EpochRecord>, new: EpochRecord) -> EpochRecord {
    match stored {
        Some(old) if old.epoch > new.epoch => old,
        Some(old) if old.epoch == new.epoch => EpochRecord {
            highest_grant_rev: old.highest_grant_rev.max(new.highest_grant_rev),
            reserved_rev: old.reserved_rev.max(new.reserved_rev),
            ..new
        },
        _ => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_a_reservation_loads_with_the_confirmed_revision() {
        let old = r#"{"epoch":2,"cluster_id":7,"advanced_at_ms":5,"reason":"restore","highest_grant_rev":40}"#;
        let r: EpochRecord = serde_json::from_str(old).unwrap();
        assert_eq!(r.highest_grant_rev, Revision::new(40));
        assert_eq!(r.reserved_rev, Revision::new(40));
        let mut new = r.clone();
        new.reserved_rev = Revision::new(90);
        let back: EpochRecord = serde_json::from_slice(&serde_json::to_vec(&new).unwrap()).unwrap();
        assert_eq!(back, new);
        assert_eq!(
            merge(Some(new.clone()), r.clone()).reserved_rev,
            Revision::new(90)
        );
        assert_eq!(merge(Some(r), new).reserved_rev, Revision::new(90));
    }
}
