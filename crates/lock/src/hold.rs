//! A granted lock, its token, its loss signal, and its release.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use palisade_fence::{FencingToken, Revision};
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::handover::Successor;
use crate::inner::LockerInner;
use crate::name::LockName;
use crate::retry;
use crate::session::{LossReason, Session};
use palisade_api::keys::LockKeys;
use palisade_api::{Enforcement, LockClass, Mode};

/// A granted lock.
///
/// A *protected* hold carries a [`FencingToken`]: send it with every write to the
/// resource. An *unprotected* hold ([`Hold::token`] is `None`) was handed out by a class
/// whose quorum policy is `open` while etcd could not commit; nothing in etcd records it,
/// and resources audit its writes as unprotected.
///
/// Dropping a hold without [`Hold::release`] releases it in the background (best effort;
/// the lease's expiry is the backstop).
pub struct Hold {
    pub(crate) locker: Arc<LockerInner>,
    pub(crate) session: Session,
    pub(crate) keys: LockKeys,
    pub(crate) name: LockName,
    pub(crate) class: Arc<LockClass>,
    pub(crate) mode: Mode,
    /// `(grant_rev, token)`; `None` for an unprotected hold.
    pub(crate) grant: Option<(Revision, FencingToken)>,
    /// The oldest waiter when the hold was granted, whom the release hands over to
    /// (see [`crate::handover`]); `None`: a plain release.
    pub(crate) successor: Option<Successor>,
    /// Whether the acquire that granted this hold ended an earlier hold of the same
    /// session on the lock, one whose release never got through (its handle let go, as
    /// the service's holds are): what was kept with that hold, such as its quota slot,
    /// is the caller's to free.
    pub(crate) replaced_earlier: bool,
    /// The acquire's attempt id (in the hold key's value).
    pub(crate) attempt: u64,
    pub(crate) done: bool,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("lock", &self.name)
            .field("mode", &self.mode)
            .field("lease", &self.session.lease())
            .field("token", &self.token())
            .finish()
    }
}

impl Hold {
    /// The fencing token, `epoch · 2^48 + grant_rev`; `None` for an unprotected hold.
    pub fn token(&self) -> Option<FencingToken> {
        self.grant.map(|(_, t)| t)
    }

    /// The revision of the Txn that granted the hold; `None` for an unprotected hold.
    pub fn grant_rev(&self) -> Option<Revision> {
        self.grant.map(|(r, _)| r)
    }

    /// Whether the hold carries a token.
    pub fn is_protected(&self) -> bool {
        self.grant.is_some()
    }

    /// The lock.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The mode it is held in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The class's enforcement, for the resource side.
    pub fn enforcement(&self) -> Enforcement {
        self.class.enforcement
    }

    /// The session the hold belongs to.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Completes when the hold's session ends (see [`Session::lost`]); from then on
    /// the hold may be granted to someone else. A force release while the session lives
    /// does not fire it: the token is then refused by resources instead.
    pub async fn lost(&self) -> LossReason {
        self.session.lost().await
    }

    /// Releases the hold: one Txn that deletes the hold key and its grant record (if it
    /// has one), only if
    /// the hold key still has this grant's create revision and this session's lease. An
    /// exclusive hold granted while others waited also hands the lock to the oldest of
    /// them in the same Txn, when that waiter still waits (the lock crate's docs, "Hand-over at release").
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotHeld`] if the hold already ended (expired, force-released);
    /// [`ErrorKind::QuorumLost`] if etcd could not commit in time.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        let result = match self.grant {
            None => Ok(()),
            Some((rev, _)) => {
                let to = self.successor.as_ref();
                release_txn(&self.locker, &self.keys, self.mode, &self.session, rev, to).await
            }
        };
        if let (Err(e), Some((rev, _))) = (&result, self.grant) {
            if e.is_quorum_lost() {
                // Keep trying in the background so the hold does not block others until
                // the lease expires. (The next acquire of this session on this lock also
                // finishes such a release first.)
                let (locker, keys, mode, session, to) = (
                    self.locker.clone(),
                    self.keys.clone(),
                    self.mode,
                    self.session.clone(),
                    self.successor.take(),
                );
                let attempt = self.attempt;
                session.set_abandoned(keys.base(), attempt, true);
                tokio::spawn(async move {
                    release_until_done(&locker, &keys, mode, &session, rev, to).await;
                    session.set_abandoned(keys.base(), attempt, false);
                });
            }
        }
        self.session.unmark_busy(self.keys.base());
        result
    }
}

impl Hold {
    /// Lets go of this handle without releasing: the hold stays in etcd until it is
    /// released by lease with [`Locker::release_by`](crate::Locker::release_by), its
    /// session's lease ends, or it is force-released. For services that hand the hold's
    /// `(lock, lease, mode, grant_rev)` to a client and keep no state of their own. (Whom
    /// the release would hand the lock over to is kept by the locker for a while, so a
    /// `release_by` through it hands over as [`Hold::release`] does.)
    pub fn forget(mut self) {
        self.done = true;
        if let (Some(to), Some((rev, _))) = (self.successor.take(), self.grant) {
            let hold_key = self.keys.hold(self.mode, self.session.lease());
            self.locker.successors.keep(hold_key, rev, to);
        }
        self.session.unmark_busy(self.keys.base());
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Some((rev, _)) = self.grant else {
            self.session.unmark_busy(self.keys.base());
            return;
        };
        // The session may acquire the lock again at once, even before the release below
        // ran: the release compares this grant's create revision and lease, so it never
        // deletes a later hold of the session, and a later acquire that finds this hold
        // still there finishes its release itself.
        let (locker, keys, mode, session, to) = (
            self.locker.clone(),
            self.keys.clone(),
            self.mode,
            self.session.clone(),
            self.successor.take(),
        );
        let attempt = self.attempt;
        // Before the lock is free to acquire again: that acquire must know this hold
        // for one being let go of.
        session.set_abandoned(keys.base(), attempt, true);
        self.session.unmark_busy(self.keys.base());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                release_until_done(&locker, &keys, mode, &session, rev, to).await;
                session.set_abandoned(keys.base(), attempt, false);
            });
        }
    }
}

/// Retries a release while etcd cannot commit and the session lives.
async fn release_until_done(
    locker: &LockerInner,
    keys: &LockKeys,
    mode: Mode,
    session: &Session,
    rev: Revision,
    to: Option<Successor>,
) {
    let mut backoff = retry::Backoff::new();
    loop {
        match release_txn(locker, keys, mode, session, rev, to.as_ref()).await {
            Err(e) if e.is_quorum_lost() && session.loss().is_none() => {
                backoff.wait(Instant::now() + Duration::from_secs(1)).await;
            }
            _ => return,
        }
    }
}

async fn release_txn(
    locker: &LockerInner,
    keys: &LockKeys,
    mode: Mode,
    session: &Session,
    rev: Revision,
    to: Option<&Successor>,
) -> Result<()> {
    release_lease_txn(
        locker,
        keys,
        mode,
        session.lease(),
        rev,
        to,
        ReleaseExtras::default(),
    )
    .await
}

/// What a caller adds to a release Txn ([`release_lease_txn`]).
#[derive(Default)]
pub(crate) struct ReleaseExtras {
    /// Compares that must hold as well (else nothing is released: `NotHeld`).
    pub(crate) when: Vec<Compare>,
    /// Ops done with the release.
    pub(crate) ops: Vec<TxnOp>,
}

/// The release Txn by lease: deletes `h/<mode>/<lease>` and its grant record (a no-op
/// for a hold without one) only if the
/// hold key has create revision `rev` and is attached to `lease`; with `to` (exclusive
/// holds only), hands the lock over to that waiter in the same Txn if it still waits.
/// With `extras`, its compares must hold too and its ops (such as freeing the hold's
/// `held_lease_quota` slot) run in the same Txn, so a slot is freed exactly when its hold
/// is.
pub(crate) async fn release_lease_txn(
    locker: &LockerInner,
    keys: &LockKeys,
    mode: Mode,
    lease: palisade_api::LeaseId,
    rev: Revision,
    to: Option<&Successor>,
    extras: ReleaseExtras,
) -> Result<()> {
    // A locker that refuses grants (its epoch checks failed) hands over nothing either.
    let to = to.filter(|_| mode == Mode::Exclusive && locker.epoch.snapshot().mismatch.is_none());
    // Built for each send (a retry builds it again), so the common case of one send
    // keeps no copy of it.
    let build = || {
        let hold = keys.hold(mode, lease);
        let mut ops = Vec::with_capacity(3 + extras.ops.len());
        ops.push(TxnOp::delete(hold.clone(), None));
        ops.push(TxnOp::delete(keys.grant(mode, lease), None));
        ops.extend(extras.ops.iter().cloned());
        if let Some(to) = to {
            ops.push(TxnOp::txn(to.txn(keys, locker.keys.epoch())));
        }
        let mut when = Vec::with_capacity(2 + extras.when.len());
        when.push(Compare::create_revision(
            hold.clone(),
            CompareOp::Equal,
            rev.as_i64(),
        ));
        when.push(Compare::lease(hold.clone(), CompareOp::Equal, lease.get()));
        when.extend(extras.when.iter().cloned());
        // Not released: whether the hold is still there (an extra compare failed) or
        // gone, read in the same Txn.
        let read = TxnOp::get(hold, Some(etcd_client::GetOptions::new().with_keys_only()));
        Txn::new().when(when).and_then(ops).or_else([read])
    };
    let deadline = Instant::now() + locker.request_timeout.max(Duration::from_millis(500)) * 3;
    let sends = std::sync::atomic::AtomicUsize::new(0);
    let resp = retry::call("release.txn", deadline, locker.request_timeout, || {
        sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (mut c, txn) = (locker.kv.clone(), build());
        async move { c.txn(txn).await }
    })
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
    if resp.succeeded() {
        return Ok(());
    }
    // A copy sent before this one got no answer and may have committed this very
    // release: a grant that is gone then counts as released (as a client counts a
    // retried release), never as "not held" to the holder that released it.
    let gone = match resp.op_responses().into_iter().next() {
        Some(etcd_client::TxnOpResponse::Get(g)) => !g
            .kvs()
            .iter()
            .any(|kv| kv.create_revision() == rev.as_i64()),
        _ => false,
    };
    if gone && sends.load(std::sync::atomic::Ordering::SeqCst) > 1 {
        return Ok(());
    }
    Err(Error::new(ErrorKind::NotHeld))
}
