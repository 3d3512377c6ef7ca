//! Hand-over at release: an exclusive holder's release Txn grants the oldest waiter.
//!
//! Without it, a contended lock changes hands in two writes in series: the holder's
//! release Txn, then (once the waiter's watch has told it) the waiter's grant Txn. With
//! it, the release Txn itself deletes the oldest waiter's waiter key and puts its hold
//! key, with the waiter's own stored meta and lease, in the same revision as the release
//! (and its grant record only where the waiter's meta asks for one):
//! one write per hand-over, and that revision is the new
//! holder's grant revision (its token is `epoch · 2^48 + revision`, as for any grant).
//!
//! The holder learns who is next when it is granted on the contended path: the grant Txn
//! (or the read that confirms a hand-over) also reads the oldest waiter of the lock, with
//! its value. The release hands over only if that waiter is exclusive and of the
//! holder's epoch, and only if, at the release's revision,
//!
//! - the waiter key still has the create revision read then (the waiter has not given
//!   up, its lease lives; a waiter created since is younger, so it is still the oldest),
//!   and its mod revision too (no retry of the waiter's acquire took the key over with
//!   a value of its own: the hold is written with the value read, which the retry's
//!   hand-over check would not know as its own),
//! - and the epoch key still has the mod revision of the holder's epoch.
//!
//! Nothing else needs comparing: while the exclusive hold exists no other hold can be
//! granted, and no grant record other than the holder's can appear (a force release
//! rewrites the holder's own record and deletes its hold, which fails the release's own
//! compare). When the nested compares fail, the release is a plain release and the
//! waiter grants itself as before.
//!
//! A hold that is let go of with [`Hold::forget`](crate::Hold::forget) (a service that
//! keeps no hold objects) leaves its successor in the locker's [`Successors`], which
//! [`Locker::release_by`](crate::Locker::release_by) takes it from: a release through
//! the same locker hands over too; one through another locker is a plain release.
//!
//! The new holder learns of its grant from the put of its own hold key, which its wait
//! watches, and confirms it with a read that is checked against the epoch like every
//! read a waiter decides on (serializable, from a member that has caught up; see
//! `acquire::waiter`). An acquire that was dropped or
//! failed meanwhile deletes the hold in its cleanup (the hold's value is the attempt's
//! meta, which the cleanup compares).

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};

use std::time::Duration;

use palisade_fence::Revision;

use palisade_api::keys::{HoldValue, LockKeys};
use palisade_api::{LeaseId, Mode};

/// Successors of holds that were forgotten, by hold key and grant revision: at most
/// [`Successors::CAPACITY`] of them, each for at most [`Successors::TTL`] (after that
/// the release is a plain one; a stale entry is harmless, as the release compares).
pub(crate) struct Successors(moka::sync::Cache<(String, Revision), Successor>);

impl Successors {
    const CAPACITY: u64 = 10_000;
    const TTL: Duration = Duration::from_secs(600);

    pub(crate) fn new() -> Self {
        Successors(
            moka::sync::Cache::builder()
                .max_capacity(Self::CAPACITY)
                .time_to_live(Self::TTL)
                .build(),
        )
    }

    /// Keeps whom the hold `hold_key` granted at `grant_rev` hands over to.
    pub(crate) fn keep(&self, hold_key: String, grant_rev: Revision, to: Successor) {
        self.0.insert((hold_key, grant_rev), to);
    }

    /// Takes whom the hold `hold_key` granted at `grant_rev` hands over to, if known.
    pub(crate) fn take(&self, hold_key: String, grant_rev: Revision) -> Option<Successor> {
        self.0.remove(&(hold_key, grant_rev))
    }
}

/// The oldest waiter of a lock, as read when the holder was granted: whom its release
/// hands the lock to.
#[derive(Debug, Clone)]
pub(crate) struct Successor {
    waiter_key: Vec<u8>,
    create_rev: i64,
    /// The waiter key's mod revision when read: a retry of the waiter's acquire that took
    /// the key over since (a put with its own value) makes the hand-over a plain release.
    mod_rev: i64,
    lease: LeaseId,
    /// The waiter key's value: the waiter's stored meta, which becomes its hold's.
    meta: Vec<u8>,
    /// Whether that meta asks for a grant record (its class has a lock-delay).
    grant_record: bool,
    /// The mod revision of the epoch key in the holder's epoch.
    epoch_mod_rev: i64,
}

/// The read, as a Txn op, of the oldest waiter of the lock (either mode), with its value.
pub(crate) fn oldest_waiter_op(keys: &LockKeys) -> TxnOp {
    TxnOp::get(keys.queue(), Some(oldest_waiter_options()))
}

/// The options of [`oldest_waiter_op`]: the `q/` prefix by create revision, first only.
pub(crate) fn oldest_waiter_options() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

impl Successor {
    /// The successor from what [`oldest_waiter_op`] read (`first`: its one key, if any),
    /// for a holder granted in `epoch` whose epoch key had `epoch_mod_rev`. `None` when
    /// there is no waiter, when the oldest is shared, or of another epoch, or not a key
    /// of the layout: the release is then a plain one.
    pub(crate) fn from_oldest(
        keys: &LockKeys,
        first: Option<&KeyValue>,
        epoch: u16,
        epoch_mod_rev: i64,
    ) -> Option<Successor> {
        let kv = first?;
        let lease = LeaseId::new(kv.lease());
        if kv.lease() == 0 || kv.key() != keys.waiter(Mode::Exclusive, lease).as_bytes() {
            return None;
        }
        let value = HoldValue::parse(kv.value())?;
        if value.epoch != epoch {
            return None;
        }
        Some(Successor {
            waiter_key: kv.key().to_vec(),
            create_rev: kv.create_revision(),
            mod_rev: kv.mod_revision(),
            lease,
            meta: kv.value().to_vec(),
            grant_record: value.grant_record,
            epoch_mod_rev,
        })
    }

    /// The nested Txn of a release that hands the lock over (see the module docs); it
    /// runs in the release Txn's success branch, after the holder's keys are deleted.
    pub(crate) fn txn(&self, keys: &LockKeys, epoch_key: String) -> Txn {
        let opts = || Some(PutOptions::new().with_lease(self.lease.get()));
        let mut ops = vec![
            TxnOp::delete(self.waiter_key.clone(), None),
            TxnOp::put(
                keys.hold(Mode::Exclusive, self.lease),
                self.meta.clone(),
                opts(),
            ),
        ];
        if self.grant_record {
            ops.push(TxnOp::put(
                keys.grant(Mode::Exclusive, self.lease),
                self.meta.clone(),
                None,
            ));
        }
        Txn::new()
            .when([
                Compare::create_revision(
                    self.waiter_key.clone(),
                    CompareOp::Equal,
                    self.create_rev,
                ),
                // The value read is still the waiter's: a retry of its acquire that took
                // the key over waits for no hold written with the value it replaced.
                Compare::mod_revision(self.waiter_key.clone(), CompareOp::Equal, self.mod_rev),
                Compare::mod_revision(epoch_key, CompareOp::Equal, self.epoch_mod_rev),
            ])
            .and_then(ops)
    }
}
