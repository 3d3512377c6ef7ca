//! Stray keys: holds, waiters, cancel markers and quota slots that no live session
//! owns. The rule of which keys count is palisade-api's (`LockKeys::is_live_entry`,
//! `is_live_slot`): a key counts only while etcd keeps it on the session lease it names.
//! A key with no lease (lease 0: `etcdctl make-mirror` copies keys without their leases)
//! or on another lease never ends by itself, so whoever meets one deletes it:
//!
//! - an acquire that reads one under its lock deletes it before deciding (it would
//!   otherwise block the lock for good and fail the grant Txn's range compares), and
//!   logs each at WARN;
//! - a rehome deletes those of the namespace on its target tier before it lifts the
//!   fence there, logs each, and answers them in [`RehomeOutcome::removed`](crate::RehomeOutcome::removed);
//! - [`Locker::lock_state`](crate::Locker::lock_state) lists those it sees as
//!   [`ForeignKey`]s, with their lease.
//!
//! Each delete compares the key's mod revision with the one read, so a key written
//! since (by anyone) is left alone.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

use palisade_api::keys::{is_live_slot, LockEntry};
use palisade_api::LeaseId;

use crate::error::{ErrorKind, Result};
use crate::locker::Locker;
use crate::retry;

/// A key under the root prefix that no live session owns, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    /// The etcd key (lossy UTF-8).
    pub key: String,
    /// The lease etcd keeps the key on: `LeaseId::new(0)` for none (a copy made without
    /// leases, or a key put by hand), else a lease other than the one the key names.
    pub lease: LeaseId,
}

/// One stray key to delete: the key and the mod revision it was read at.
#[derive(Debug, Clone)]
pub(crate) struct Stray {
    pub(crate) key: Vec<u8>,
    pub(crate) mod_rev: i64,
    pub(crate) lease: i64,
}

/// The most deletes one Txn carries (etcd's default `--max-txn-ops` is 128).
pub(crate) const PER_TXN: usize = 64;

/// A Txn that deletes each of `strays` (at most [`PER_TXN`]) that still has the mod
/// revision it was read at; logs each at WARN.
pub(crate) fn delete_txn(strays: &[Stray], why: &str) -> Txn {
    let ops: Vec<TxnOp> = strays
        .iter()
        .map(|s| {
            tracing::warn!(
                key = %String::from_utf8_lossy(&s.key),
                lease = %LeaseId::new(s.lease),
                "{why}: deleting a key no live session owns (no lease, or not the lease it names)"
            );
            TxnOp::txn(
                Txn::new()
                    .when([Compare::mod_revision(
                        s.key.clone(),
                        CompareOp::Equal,
                        s.mod_rev,
                    )])
                    .and_then([TxnOp::delete(s.key.clone(), None)]),
            )
        })
        .collect();
    Txn::new().and_then(ops)
}

impl Locker {
    /// Deletes the stray keys of namespace `ns` on this locker's cluster: holds, waiters
    /// and cancel markers under `locks/<ns>/` not on the lease they name, and quota slots
    /// of `ns` on no lease. Grant records (lease-less by design) and keys of other
    /// shapes are left. Answers what it deleted.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuorumLost`] if etcd does not answer.
    pub(crate) async fn remove_strays(&self, ns: &str) -> Result<Vec<ForeignKey>> {
        let keys = &self.inner.keys;
        let deadline = Instant::now() + self.inner.request_timeout * 3;
        let mut strays = Vec::new();
        for prefix in [keys.namespace_locks(ns), keys.quota_slots(ns)] {
            let resp = retry::call("stray.read", deadline, self.inner.request_timeout, || {
                let (mut c, prefix) = (self.client().clone(), prefix.clone());
                async move {
                    c.get(
                        prefix,
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    )
                    .await
                }
            })
            .await
            .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
            for kv in resp.kvs() {
                let stray = match keys.parse_lock_entry(kv.key()).map(|e| e.entry) {
                    Some(
                        LockEntry::Hold(_, lease)
                        | LockEntry::Waiter(_, lease)
                        | LockEntry::CancelMarker(lease, _),
                    ) => kv.lease() != lease.get(),
                    Some(_) => false,
                    None => {
                        kv.key().starts_with(keys.quota_slots(ns).as_bytes())
                            && !is_live_slot(kv.lease())
                    }
                };
                if stray {
                    strays.push(Stray {
                        key: kv.key().to_vec(),
                        mod_rev: kv.mod_revision(),
                        lease: kv.lease(),
                    });
                }
            }
        }
        for chunk in strays.chunks(PER_TXN) {
            let txn = delete_txn(chunk, "rehome");
            retry::call("stray.delete", deadline, self.inner.request_timeout, || {
                let (mut c, txn) = (self.client().clone(), txn.clone());
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        }
        Ok(strays
            .into_iter()
            .map(|s| ForeignKey {
                key: String::from_utf8_lossy(&s.key).into_owned(),
                lease: LeaseId::new(s.lease),
            })
            .collect())
    }
}
