//! The epoch record, the durable store's contract, and the max-merge every store keeps.

use std::future::Future;
use std::pin::Pin;

use palisade_api::EpochRecord;

/// A boxed, sendable future, as returned by [`EpochStore`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error type of an [`EpochStore`].
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// The durable record outside etcd: [`FileEpochStore`](crate::FileEpochStore) (one host) or
/// `PostgresEpochStore` (feature `postgres`, shared by replicas).
///
/// `store` must be durable when its future completes. A locker writes it at start, when
/// an epoch is advanced, and when it raises its reservation (about once per half
/// reservation window of etcd revisions; see the epoch rules in this module), not on
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
    use palisade_fence::Revision;

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
