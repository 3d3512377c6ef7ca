//! The session's own keys on a lock: one acquire per session and lock at a time, told
//! apart by the `attempt` and `request` in the keys' values (see [`AcquireAttempt`]).
//! The enqueue that never overwrites another acquire's waiter key, the take-over of a
//! waiter key by a retry of its attempt, and the decision on a hold of the session's.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use palisade_api::keys::HoldValue;
use palisade_api::{AttemptId, Mode};
use palisade_fence::Revision;
use std::sync::atomic::Ordering;

use super::decide::Entry;
use super::Attempt;
use crate::error::{Error, ErrorKind, Result};
use crate::handover::oldest_waiter_op;

/// How long the keys of a dropped acquire request whose attempt its caller named wait
/// for a retry of the attempt before they are deleted (see [`AcquireAttempt`]): a
/// client whose connection was reset sends the attempt again within this, and keeps its
/// place. Ended at once when the process settles ([`Locker::settle`](crate::Locker::settle)).
pub(crate) const RETRY_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How an acquire is named, and which earlier hold of its session it ends.
///
/// A session has at most one acquire of a lock at a time: one waiter key and one hold
/// key per lock (in one mode). An acquire finding a hold or waiter key of its session
/// on the lock tells by the key's value who wrote it:
///
/// - its own attempt (the same [`id`](AcquireAttempt::id)): a grant whose answer was
///   lost, or a retry of the acquire after a reset connection. It adopts the hold, or
///   takes over the waiter key (a put that keeps its create revision, so its place in
///   the queue), writing its own request id into the value. The request it took over
///   then ends with [`ErrorKind::AcquireInFlight`] (`taken_over`) and deletes nothing
///   of the keys it no longer owns (every cleanup delete compares the whole value).
///   A request of a named attempt that is dropped (its client's connection reset)
///   leaves its keys for a retry grace (2 s) before its cleanup deletes them, so
///   that the retry finds its place; a waiter that reaches the head of the queue
///   meanwhile holds the lock up for at most that long.
/// - the hold named by [`replaces`](AcquireAttempt::replaces): a hold whose holder let
///   it go without knowing if its release got through. It is ended (hold key and grant
///   record, in one Txn that compares its create revision) and the acquire goes on.
/// - anything else: another acquire's. Refused with [`ErrorKind::AlreadyHeld`] or
///   [`ErrorKind::AcquireInFlight`]; a hold answered to its caller ends only by its own
///   release, its lease's expiry, or a force release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireAttempt {
    /// The attempt's id; `None` picks a random one (the acquire then cannot be retried
    /// as the same attempt).
    pub id: Option<AttemptId>,
    /// The grant revision of an earlier hold of the session on the lock to end.
    pub replaces: Option<Revision>,
}

/// A random request id (not 0, which values written before request ids read as).
pub(super) fn request_id() -> u64 {
    AttemptId::random().get()
}

/// Who wrote a hold key of this session that a view found.
pub(super) enum OwnHold {
    /// This attempt: its grant committed, the answer was lost; or a retry of the
    /// acquire finds the hold an earlier request of it was granted. `rewrite`: the
    /// hold was written by another request (its mod revision and value).
    Ours { rewrite: Option<(i64, Vec<u8>)> },
    /// The hold the acquire named in `replaces`: its holder let it go.
    Replaced,
    /// Another acquire's hold ([`ErrorKind::AlreadyHeld`]).
    Other { mode: Mode, attempt: u64 },
    /// The key is gone or was written again since the view: read anew.
    Changed,
}

impl Attempt {
    /// The enqueue, as a Txn op: put this request's waiter key if the session has none
    /// on the lock in this mode; else read the one there (with its value), which
    /// [`Attempt::enqueued`] tells apart.
    pub(super) fn enqueue_op(&self) -> TxnOp {
        let waiter = self.keys.waiter(self.mode, self.session.lease());
        TxnOp::txn(
            Txn::new()
                .when([Compare::create_revision(
                    waiter.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(
                    waiter.clone(),
                    self.meta.clone(),
                    Some(PutOptions::new().with_lease(self.lease())),
                )])
                .or_else([TxnOp::get(waiter, None)]),
        )
    }

    /// What [`Attempt::enqueue_op`] did, in the Txn whose header is `header`: this
    /// request's waiter key is written (its mod revision noted), or taken over from an
    /// earlier request of the attempt; or another attempt's waits, and this one is
    /// refused.
    /// `true` when it wrote after the Txn (a take-over), so that the state the Txn read
    /// is stale.
    pub(super) async fn enqueued(
        &self,
        header_rev: i64,
        op: Option<TxnOpResponse>,
    ) -> Result<bool> {
        let Some(TxnOpResponse::Txn(put)) = op else {
            return Err(Error::new(ErrorKind::Etcd));
        };
        if put.succeeded() {
            self.waiter_put_rev.store(header_rev, Ordering::SeqCst);
            return Ok(false);
        }
        let found = match put.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
            _ => return Err(Error::new(ErrorKind::Etcd)),
        };
        let Some(kv) = found else {
            return Err(Error::new(ErrorKind::Etcd));
        };
        self.own_waiter(&kv).await
    }

    /// Decides on a waiter key of this session's in this attempt's mode, read with its
    /// value: this request's (a copy of its enqueue applied before), an earlier request's
    /// of the attempt (taken over: a put that keeps its create revision, so its place),
    /// or another attempt's ([`ErrorKind::AcquireInFlight`]). `true` when it wrote.
    async fn own_waiter(&self, kv: &etcd_client::KeyValue) -> Result<bool> {
        let value = HoldValue::parse(kv.value());
        match value.as_ref().map(|v| (v.attempt, v.request)) {
            Some((a, r)) if a == self.id && r == self.request => {
                self.waiter_put_rev
                    .store(kv.mod_revision(), Ordering::SeqCst);
                Ok(false)
            }
            // A retry of this attempt, or the session's next acquire after one of this
            // handle's was dropped (its cleanup not yet done): take the key over.
            Some((a, _)) if a == self.id || self.abandoned.contains(&a) => {
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        kv.key().to_vec(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )])
                    .and_then([TxnOp::put(
                        kv.key().to_vec(),
                        self.meta.clone(),
                        Some(PutOptions::new().with_lease(self.lease())),
                    )]);
                let resp = self.txn(txn).await?;
                if resp.succeeded() {
                    let rev = resp.header().map_or(0, |h| h.revision());
                    self.waiter_put_rev.store(rev, Ordering::SeqCst);
                    tracing::debug!(lock = ?self.name, attempt = self.id, "retry took over its attempt's place");
                }
                // Not: the key changed since the read; the loop reads it anew.
                Ok(true)
            }
            other => Err(Error::new(ErrorKind::AcquireInFlight {
                attempt: other.map_or(0, |(a, _)| a),
                taken_over: false,
            })),
        }
    }

    /// Reads the session's hold key `h` of the lock, which a view listed (keys only),
    /// and tells who wrote it (see [`AcquireAttempt`]): this
    /// attempt (its `attempt` in the stored value: a grant whose answer was lost, or a
    /// retry of the acquire), the hold named in `replaces`, or another acquire.
    /// The same read finds the oldest waiter, whom the hold hands over to if it is
    /// ours (a hand-over whose put this waiter did not see before it woke comes this way).
    pub(super) async fn own_hold(&self, h: &Entry) -> Result<OwnHold> {
        let resp = self
            .read_txn([
                TxnOp::get(h.key.clone(), None),
                oldest_waiter_op(&self.keys),
            ])
            .await?;
        let mut gets = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => Ok(g.kvs().first().cloned()),
            _ => Err(Error::new(ErrorKind::Etcd)),
        });
        let (kv, oldest) = (
            gets.next().transpose()?.flatten(),
            gets.next().transpose()?.flatten(),
        );
        let Some(kv) = kv.filter(|kv| kv.create_revision() == h.create_rev) else {
            return Ok(OwnHold::Changed);
        };
        let value = HoldValue::parse(kv.value());
        let mine = h.key == self.keys.hold(self.mode, self.session.lease()).as_bytes();
        match value.as_ref() {
            Some(v) if mine && v.attempt == self.id => {
                if self.mode == Mode::Exclusive {
                    self.set_successor(oldest.as_ref());
                }
                Ok(OwnHold::Ours {
                    rewrite: (v.request != self.request)
                        .then(|| (kv.mod_revision(), kv.value().to_vec())),
                })
            }
            _ if self.replaces.is_some_and(|r| r.as_i64() == h.create_rev) => Ok(OwnHold::Replaced),
            // Granted to an acquire of this handle that was dropped before it saw the
            // grant: nobody was told of it, and its cleanup is under way.
            Some(v) if self.abandoned.contains(&v.attempt) => Ok(OwnHold::Replaced),
            v => Ok(OwnHold::Other {
                mode: v.map_or(self.mode, |v| v.mode),
                attempt: v.map_or(0, |v| v.attempt),
            }),
        }
    }

    /// Makes the session's hold `h`, written by this attempt, this request's: deletes
    /// this request's waiter key, and with `rewrite` (the hold was written by another
    /// request of the attempt: its mod revision and value) puts the hold and its grant
    /// record again with this request's value, keeping their create revisions (so the
    /// grant revision and token), so that the other request's cleanup, which compares
    /// its own value, leaves them alone. `false` if the hold changed since it was read.
    pub(super) async fn adopt(&self, h: &Entry, rewrite: Option<(i64, Vec<u8>)>) -> Result<bool> {
        let lease = self.session.lease();
        let waiter = self.keys.waiter(self.mode, lease);
        let drop_waiter = TxnOp::txn(
            Txn::new()
                .when([Compare::value(
                    waiter.clone(),
                    CompareOp::Equal,
                    self.meta.clone(),
                )])
                .and_then([TxnOp::delete(waiter, None)]),
        );
        let Some((mod_rev, old)) = rewrite else {
            let _ = self.txn(Txn::new().and_then([drop_waiter])).await;
            return Ok(true);
        };
        let grant = self.keys.grant_for_hold(&h.key);
        let txn = Txn::new()
            .when([
                Compare::create_revision(h.key.clone(), CompareOp::Equal, h.create_rev),
                Compare::mod_revision(h.key.clone(), CompareOp::Equal, mod_rev),
            ])
            .and_then([
                TxnOp::put(
                    h.key.clone(),
                    self.meta.clone(),
                    Some(PutOptions::new().with_lease(lease.get())),
                ),
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(grant.clone(), CompareOp::Equal, old)])
                        .and_then([TxnOp::put(grant, self.meta.clone(), None)]),
                ),
                drop_waiter,
            ]);
        let adopted = self.txn(txn).await?.succeeded();
        if adopted {
            // The earlier request's quota slot goes: this request's own stays.
            self.replaced_earlier
                .store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::debug!(lock = ?self.name, attempt = self.id, "retry adopted its attempt's hold");
        }
        Ok(adopted)
    }

    /// The `attempt` stored in the session's key `key` (0 if it is gone or not holder
    /// meta).
    pub(super) async fn attempt_of(&self, key: &[u8]) -> Result<u64> {
        let resp = self.read_txn([TxnOp::get(key.to_vec(), None)]).await?;
        Ok(match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .and_then(|kv| HoldValue::parse(kv.value()))
                .map_or(0, |v| v.attempt),
            _ => 0,
        })
    }
}
