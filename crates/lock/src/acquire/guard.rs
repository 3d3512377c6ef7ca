//! The cleanup of an acquire that does not end in a hold, and [`TxnGuard`], a caller's
//! additions to the acquire's first Txn (and to that cleanup).
//!
//! A dropped or failed acquire deletes the waiter key, and a hold and grant record whose
//! grant it never saw, that it wrote; each delete compares the value with the attempt's
//! meta. If a key-creating Txn of the attempt may still be in flight, the same cleanup
//! Txn writes the cancel marker (see [the key layout](crate#key-layout)).

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use super::Attempt;
use crate::inner::LockerInner;
use crate::retry::{self, CallError};
use crate::session::Session;
use palisade_api::keys::LockKeys;
use palisade_api::Mode;

/// What a caller adds to an acquire's first Txn (the one that grants or enqueues): its
/// compares (`when`) and writes (`then`) go into the Txn's outer branch with the cancel
/// marker's compare, so they commit with the grant or the waiter key and never without.
/// If `when` fails, nothing of the acquire is written: the acquire fails with
/// [`ErrorKind::Etcd`] and `failed` holds the responses of `or_else` (reads, at the Txn's
/// revision). `cleanup` goes into the Txn that deletes what a failed or dropped acquire
/// wrote (the same Txn that writes its cancel marker), so it undoes `then`.
pub(crate) struct TxnGuard {
    pub(crate) when: Vec<Compare>,
    pub(crate) then: Vec<TxnOp>,
    pub(crate) or_else: Vec<TxnOp>,
    pub(crate) cleanup: Vec<TxnOp>,
    pub(crate) failed: std::sync::Mutex<Option<Vec<TxnOpResponse>>>,
}

impl TxnGuard {
    /// The responses of `or_else` if `when` failed (taken: a second call is `None`).
    pub(crate) fn take_failed(&self) -> Option<Vec<TxnOpResponse>> {
        self.failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Drop for Attempt {
    /// A dropped or failed acquire deletes whatever it may have written: its waiter key,
    /// and a hold and grant record whose grant response it never saw. It retries while
    /// etcd cannot commit and the session lives (a leftover waiter key would otherwise
    /// stall the queue behind it until the lease ends). The deletes compare the value
    /// with this attempt's meta, so a later attempt of the session is never touched and
    /// the session may acquire the lock again at once.
    fn drop(&mut self) {
        if self.disarmed {
            return;
        }
        let (locker, keys, mode, session, meta, owns_busy, id) = (
            self.locker.clone(),
            self.keys.clone(),
            self.mode,
            self.session.clone(),
            std::mem::take(&mut self.meta),
            self.owns_busy,
            self.id,
        );
        let extra = self.guard_cleanup();
        let marker = self.marker();
        // A request named by its client may be sent again (its connection was reset):
        // its keys wait a while for the retry to take them over (a put with its own
        // value, which this cleanup's compares then leave alone), so the retry keeps
        // its place in the queue.
        let grace = if self.named {
            super::RETRY_GRACE
        } else {
            std::time::Duration::ZERO
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                // Marked before the lock is free to acquire again, so that the next
                // acquire knows these keys for a dropped one's.
                session.set_abandoned(keys.base(), id, true);
                if owns_busy {
                    session.unmark_busy(keys.base());
                }
                let running = locker.cleanups.start();
                rt.spawn(async move {
                    let _running = running;
                    let _abandoned = Abandoned {
                        session: &session,
                        base: keys.base(),
                        id,
                    };
                    if !grace.is_zero() {
                        locker.cleanups.grace(grace).await;
                    }
                    let mut backoff = retry::Backoff::new();
                    while let Err(CallError::Unavailable(_) | CallError::Cut) = cleanup(
                        &locker,
                        &keys,
                        mode,
                        &session,
                        &meta,
                        marker.as_deref(),
                        &extra,
                        3,
                    )
                    .await
                    {
                        if session.loss().is_some() {
                            return;
                        }
                        backoff
                            .wait(Instant::now() + std::time::Duration::from_secs(1))
                            .await;
                    }
                });
            }
            Err(_) => {
                if owns_busy {
                    session.unmark_busy(keys.base());
                }
            }
        }
    }
}

/// Ends an acquire's [`Session::set_abandoned`] mark when its cleanup ends (done, or
/// given up with the session).
struct Abandoned<'a> {
    session: &'a Session,
    base: &'a str,
    id: u64,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        self.session.set_abandoned(self.base, self.id, false);
    }
}

/// Deletes the waiter key, and the hold and grant record, that this attempt wrote, and
/// nothing else: each delete compares the key's value with this attempt's meta (unique
/// per attempt), so a later acquire of the same session is never touched. One Txn with
/// two nested Txns (etcd 3.3+). With `marker`, the same Txn also puts the attempt's
/// cancel marker on the session's lease, so a Txn of the attempt that reaches etcd
/// after this one does nothing, and `extra` (a [`TxnGuard`]'s cleanup). It tries for
/// `timeouts` request timeouts.
#[allow(clippy::too_many_arguments)]
pub(super) async fn cleanup(
    locker: &LockerInner,
    keys: &LockKeys,
    mode: Mode,
    session: &Session,
    meta: &[u8],
    marker: Option<&str>,
    extra: &[TxnOp],
    timeouts: u32,
) -> Result<(), CallError> {
    let lease = session.lease();
    let (waiter, hold) = (keys.waiter(mode, lease), keys.hold(mode, lease));
    let mut ops = Vec::with_capacity(3);
    if let Some(m) = marker {
        ops.push(TxnOp::put(
            m,
            Vec::new(),
            Some(PutOptions::new().with_lease(lease.get())),
        ));
    }
    ops.extend([
        TxnOp::txn(
            Txn::new()
                .when([Compare::value(
                    waiter.clone(),
                    CompareOp::Equal,
                    meta.to_vec(),
                )])
                .and_then([TxnOp::delete(waiter, None)]),
        ),
        TxnOp::txn(
            Txn::new()
                .when([Compare::value(
                    hold.clone(),
                    CompareOp::Equal,
                    meta.to_vec(),
                )])
                .and_then([
                    TxnOp::delete(hold, None),
                    TxnOp::delete(keys.grant(mode, lease), None),
                ]),
        ),
    ]);
    ops.extend(extra.iter().cloned());
    let txn = Txn::new().and_then(ops);
    let deadline = Instant::now() + locker.request_timeout * timeouts;
    retry::call("acquire.cleanup", deadline, locker.request_timeout, || {
        let (mut c, txn) = (locker.kv.clone(), txn.clone());
        async move { c.txn(txn).await }
    })
    .await
    .map(drop)
}
