//! Acquire: one Txn when uncontended (it grants, or enqueues and reads the lock);
//! otherwise a FIFO waiter woken only by writes to its predecessor's keys (from the
//! locker's one watch on the lock), and a grant Txn whose header revision is the
//! token's revision. `decide.rs` decides each round on the lock read at one revision;
//! `wait.rs` waits on the one waiter or holder that blocks it.
//!
//! # Granting rules
//!
//! - Uncontended exclusive acquire, one Txn: if `h/`, `q/` and `g/` are empty (etcd
//!   compares a create revision over an empty range as 0) and the epoch key is unchanged,
//!   put `h/x/<lease>` (on the lease), and `g/x/<lease>` for a class with a lock-delay
//!   (the grant record: see [`needs_grant_record`]); else put the waiter key (only if
//!   the session has none there: else read it) and read queue, holds and grant records
//!   in the same Txn. Shared: the same with `h/x/`, `q/x/`, `g/x/`, and no
//!   `h/s/<lease>` or `q/s/<lease>` of its own.
//! - One acquire per session and lock: keys of the session's own on the lock are
//!   decided on first, by the `attempt` and `request` in their value (see
//!   [`AcquireAttempt`]): its own attempt's are adopted (a hold) or taken over in place
//!   (a waiter key); the hold named in `replaces` is ended; any other is refused, and a
//!   hold answered to its caller is never ended by another acquire.
//! - A waiter decides on queue, holds and grant records read at one revision. Exclusive:
//!   it waits for the waiter just ahead of it, else for one holder. Shared: for the
//!   exclusive waiter just ahead of it, else for one exclusive holder. For a waiter ahead
//!   it waits on that waiter's key and its lease's hold key, and wakes when both are
//!   gone, that is on the predecessor's release (or its giving up); for a holder, on its
//!   hold key. An exclusive waiter also wakes when its own hold key is put (a
//!   hand-over, below).
//!   The waiters of a locker on one lock share one watch on its hold and waiter keys,
//!   created by the first of them from etcd's current revision (a past start revision
//!   is served by etcd's 100 ms catch-up loop) and cancelled when the last leaves; it
//!   keeps its latest messages, so a waiter that joins it after its view was read
//!   misses nothing (else it reads its keys once). A waiter whose lock's watch passed
//!   nothing on for ten request timeouts reads its keys anyway, and a write found that
//!   way ends the watch, which the next waiter creates anew. These watches share four streams per
//!   locker (etcd multiplexes watches on a stream by watch id); when one fails, every
//!   waiter on it reads anew. No polling and no thundering herd: a release wakes one
//!   waiter.
//!   Woken, it sends its grant Txn at once (allowing no grant record at all); a grant
//!   Txn that fails reads the lock in its else branch, and the waiter decides again.
//!   These reads are keys only (which keys exist, and their revisions); a hold of the
//!   waiter's own session is read with its value, to tell its own attempt's grant (a
//!   grant whose answer was lost, adopted) from the hold named in `replaces` (ended) and
//!   from another acquire's (refused). The grant Txn also compares the waiter key's mod
//!   revision with this request's own write of it: a key taken over by a retry of the
//!   attempt is the retry's to grant. Every read and Txn answer
//!   is checked against the epoch (see [`crate::epoch`]), and the wait's watch messages raise
//!   the locker's high water, so a waiter that sat in a watch still knows how far etcd
//!   had moved.
//! - When nothing blocks it, it grants itself in one Txn that compares its own waiter
//!   key's create revision (a waiter whose lease expired lost its key and can never be
//!   granted; a put on a dead lease also fails the Txn), the epoch key, no grant record
//!   changed since the read, and: exclusive, no holds and every waiter created at or after
//!   its own; shared, no exclusive hold and every exclusive waiter created after its own.
//!   Then it deletes its waiter key and puts the hold (and grant record). Only a
//!   *succeeded* grant Txn's header revision is a grant revision (on the else branch it
//!   is just the current revision).
//! - Hand-over at release: an exclusive holder granted on the contended path read the
//!   oldest waiter of the lock (with its value) in its grant Txn. If that waiter is
//!   exclusive and of the holder's epoch, the release Txn also grants it, in a nested
//!   Txn that compares the waiter key's create revision (it still waits; any waiter
//!   created since is younger) and the epoch key: it deletes the waiter key and puts its
//!   hold key (on its lease) and grant record if its meta asks for one, with the
//!   waiter's stored meta. One write
//!   per hand-over instead of two in series; the release's revision is the new grant
//!   revision. The waiter sees its hold key's put (newer than the state it waited on),
//!   confirms it with a read checked against the epoch (its hold key as handed over, the
//!   epoch key unchanged), which also reads whom it hands over to in turn. That read is
//!   serializable (no read index through the leader): it decides on a past write, so it
//!   is taken from a member that applied the hand-over and every revision the locker has
//!   seen, and sent again linearizable when a lagging member answers. If the nested
//!   compares fail, the release is a plain one and the waiter grants itself.
//! - Lock-delay: if grant records of ended holds are found (expiry or force), the waiter
//!   grants no sooner than `lock_delay` after it first observed them. Holds of a class
//!   without a lock-delay leave no record when they expire (they write none); a force
//!   release always leaves one, deleted by the next grant. That instant is
//!   after the hold actually ended, so the delay is measured conservatively.
//! - A wait that times out or whose future is dropped deletes its waiter key, and a
//!   hold whose grant it never saw (inline on error, from a spawned task on drop); the
//!   deletes compare the value with the attempt's meta. If a key-creating Txn of the
//!   attempt may still be in flight, the same cleanup Txn writes the cancel marker (see
//!   [the key layout](crate#key-layout)). A waiter's grant Txn needs no marker: it
//!   compares its own waiter key's create revision, and the cleanup deleted that key.
//! - A granted attempt whose key-creating Txn may still be in flight writes the marker
//!   before it hands out the hold (`Attempt::settle`): a late copy would otherwise
//!   enqueue the session behind its own hold, or grant it the lock again after the
//!   release.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use palisade_fence::{Epoch, FencingToken, Revision};
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::handover::Successor;
use crate::hold::Hold;
use crate::inner::LockerInner;
use crate::name::LockName;
use crate::retry;
use crate::session::Session;
use palisade_api::keys::{HoldValue, LockKeys};
use palisade_api::HolderMeta;
use palisade_api::{AttemptId, InvalidInput};
use palisade_api::{LockClass, Mode, QuorumPolicy};

mod decide;
mod guard;
mod own;
mod wait;

use guard::cleanup;
pub(crate) use guard::TxnGuard;
pub use own::AcquireAttempt;
use own::{request_id, RETRY_GRACE};

use decide::Step;

/// Failed grant Txns in a row (each on the state the previous one returned) before the
/// waiter loop backs off.
const RACES_BEFORE_BACKOFF: u32 = 3;

/// The budget of one etcd call of an acquire, in request timeouts (see
/// `Attempt::call_deadline`).
const CALL_TIMEOUTS: u32 = 3;

/// Everything one acquire needs, and the cleanup if it does not end in a hold.
struct Attempt {
    /// The attempt's id ([`AcquireAttempt::id`], or a random one): a key of the
    /// session's with this id in its value is this acquire's, written by this request
    /// or an earlier one of the same attempt.
    id: u64,
    /// This request's id, random: tells this request's writes from those of another
    /// request of the same attempt (see [`HoldValue::request`]).
    request: u64,
    /// The grant revision of an earlier hold of the session on the lock that this
    /// acquire ends ([`AcquireAttempt::replaces`]).
    replaces: Option<Revision>,
    /// The attempts of this session handle on the lock that were dropped or let go of
    /// before this one began, and whose keys may still be there (see
    /// `Session::abandoned`): keys of theirs are no live acquire's.
    abandoned: Vec<u64>,
    /// Whether the attempt's id was given by the caller, who may send it again: a
    /// dropped request's cleanup then waits [`RETRY_GRACE`] first.
    named: bool,
    /// The mod revision of this request's last write of its waiter key (0: none yet).
    /// A waiter key with another mod revision was taken over by a retry of the attempt.
    waiter_put_rev: AtomicI64,
    /// The epoch this attempt grants under: its number goes into the meta and the
    /// token, its `config/epoch` mod revision into every grant Txn's compares.
    epoch: Epoch,
    epoch_mod_rev: i64,
    locker: Arc<LockerInner>,
    session: Session,
    keys: LockKeys,
    name: LockName,
    class: Arc<LockClass>,
    mode: Mode,
    deadline: Instant,
    meta: Vec<u8>,
    /// Set once a [`Hold`] owns the lock's keys (or nothing needs cleaning).
    disarmed: bool,
    /// Whether a key-creating Txn of this attempt may still reach etcd later (it was
    /// sent but its answer never came, or it was sent more than once): cleanup then
    /// writes the attempt's cancel marker, which makes such a Txn do nothing.
    unsettled: AtomicBool,
    /// Whether dropping this attempt ends the session's claim on the lock (not when an
    /// unprotected [`Hold`] took it over).
    owns_busy: bool,
    /// The oldest waiter, read when this attempt was granted on the contended path: the
    /// hold's release hands over to it.
    successor: std::sync::Mutex<Option<Successor>>,
    /// The caller's additions to the first Txn, if any.
    guard: Option<Arc<TxnGuard>>,
    /// Whether this attempt ended an earlier hold of its session on the lock (see
    /// `Hold::replaced_earlier`).
    replaced_earlier: AtomicBool,
}

/// Whether a grant in `class` writes a grant record (`g/<m>/<lease>`, no lease): only
/// with a lock-delay, which the record outliving an expired hold times. Every session's
/// lease carries a marker (`leases/<lease>`, or a detached session's record), so an
/// expiry is told from a release without one (see `palisade_api::keys`).
fn needs_grant_record(class: &LockClass) -> bool {
    !class.lock_delay.is_zero()
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire(
    locker: Arc<LockerInner>,
    session: &Session,
    name: &LockName,
    class: Arc<LockClass>,
    mode: Mode,
    deadline: Instant,
    holder_meta: Option<&HolderMeta>,
    named: AcquireAttempt,
    guard: Option<Arc<TxnGuard>>,
) -> Result<Hold> {
    if session.loss().is_some() {
        return Err(Error::new(ErrorKind::SessionLost));
    }
    let keys = locker.keys.lock(&name.ns, &name.class, &name.key);
    if !session.mark_busy(keys.base()) {
        return Err(Error::invalid(InvalidInput::AlreadyAcquiring));
    }
    let epoch = locker.epoch.snapshot();
    let id = named.id.unwrap_or_else(AttemptId::random).get();
    let request = request_id();
    let meta = serde_json::to_vec(&HoldValue {
        spiffe_id: Cow::Borrowed(session.spiffe_id().as_str()),
        class: Cow::Borrowed(&class.id),
        mode,
        epoch: epoch.record.epoch.get(),
        attempt: id,
        request,
        holder_meta: holder_meta.map(Cow::Borrowed),
        grant_record: needs_grant_record(&class),
    })
    .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
    let abandoned = session.abandoned(keys.base());
    let mut attempt = Attempt {
        id,
        request,
        replaces: named.replaces,
        named: named.id.is_some(),
        abandoned,
        waiter_put_rev: AtomicI64::new(0),
        epoch: epoch.record.epoch,
        epoch_mod_rev: epoch.etcd_mod_rev,
        locker,
        session: session.clone(),
        keys,
        name: name.clone(),
        class,
        mode,
        deadline,
        meta,
        disarmed: false,
        unsettled: AtomicBool::new(false),
        owns_busy: true,
        successor: std::sync::Mutex::new(None),
        guard,
        replaced_earlier: AtomicBool::new(false),
    };
    if let Some(m) = epoch.mismatch {
        attempt.disarmed = true;
        session.unmark_busy(attempt.keys.base());
        return Err(Error::epoch(m));
    }
    let result = match attempt.run().await {
        Ok(grant) => attempt.settle().await.map(|()| grant),
        Err(e) => Err(e),
    };
    match result {
        Ok(grant) => {
            attempt.disarmed = true;
            Ok(attempt.hold(grant))
        }
        Err(e) if e.is_quorum_lost() && attempt.class.on_quorum_loss == QuorumPolicy::Open => {
            // Unprotected grant: nothing recorded in etcd; the keys this attempt may have
            // written are deleted by the drop guard once etcd answers again.
            tracing::warn!(lock = ?attempt.name, "etcd unavailable: unprotected grant for an open class");
            let hold = attempt.hold(None);
            attempt.owns_busy = false;
            drop(attempt);
            Ok(hold)
        }
        Err(e) if e.is_quorum_lost() => Err(e), // the drop guard cleans up once etcd answers
        Err(e)
            if attempt.marker().is_none()
                && attempt
                    .guard
                    .as_ref()
                    .is_some_and(|g| g.failed.lock().is_ok_and(|f| f.is_some())) =>
        {
            // The guard's compares failed on the one copy sent: nothing was written.
            attempt.disarmed = true;
            attempt.session.unmark_busy(attempt.keys.base());
            Err(e)
        }
        Err(e) => {
            // Delete what we may have written before reporting, so a caller that looks
            // right after finds no waiter key. One request timeout at most: if etcd does
            // not answer in that, the drop guard goes on in the background rather than
            // keep the caller long past its deadline.
            if cleanup(
                &attempt.locker,
                &attempt.keys,
                attempt.mode,
                &attempt.session,
                &attempt.meta,
                attempt.marker().as_deref(),
                &attempt.guard_cleanup(),
                1,
            )
            .await
            .is_ok()
            {
                attempt.disarmed = true;
                attempt.session.unmark_busy(attempt.keys.base());
            }
            Err(e)
        }
    }
}

impl Attempt {
    fn hold(&self, grant: Option<(Revision, FencingToken)>) -> Hold {
        Hold {
            locker: self.locker.clone(),
            session: self.session.clone(),
            keys: self.keys.clone(),
            name: self.name.clone(),
            class: self.class.clone(),
            mode: self.mode,
            grant,
            successor: self
                .successor
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
            replaced_earlier: self.replaced_earlier.load(Ordering::SeqCst),
            attempt: self.id,
            done: false,
        }
    }

    fn lease(&self) -> i64 {
        self.session.lease().get()
    }

    /// Before a granted attempt hands out its hold: if a copy of one of its key-creating
    /// Txns may still reach etcd (`unsettled`), puts the cancel marker, so such a copy
    /// does nothing, and in the same Txn deletes a waiter key of this attempt that a
    /// copy already wrote. Unsettled, a late copy of the first Txn would enqueue the
    /// session behind its own hold, or, after the release, grant it the lock again: a
    /// hold nobody knows of, blocking the lock until the session ends.
    ///
    /// Nothing falls back on this write (without it the acquire fails), so it has the
    /// budget of the acquire's other calls ([`Attempt::call_deadline`]): the caller's
    /// deadline, at least [`CALL_TIMEOUTS`] request timeouts. A member that stopped
    /// answering while its connection stays up costs each attempt sent to it a whole
    /// request timeout (an unanswered send is what leaves an attempt unsettled), and a
    /// retry may reach a member that answers.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuorumLost`] when etcd does not answer within that budget; the drop
    /// guard then cleans up, marker included.
    async fn settle(&self) -> Result<()> {
        let Some(marker) = self.marker() else {
            return Ok(());
        };
        let lease = self.session.lease();
        let waiter = self.keys.waiter(self.mode, lease);
        let txn = Txn::new().and_then([
            TxnOp::put(
                marker,
                Vec::new(),
                Some(PutOptions::new().with_lease(lease.get())),
            ),
            TxnOp::txn(
                Txn::new()
                    .when([Compare::value(
                        waiter.clone(),
                        CompareOp::Equal,
                        self.meta.clone(),
                    )])
                    .and_then([TxnOp::delete(waiter, None)]),
            ),
        ]);
        retry::call(
            "acquire.settle",
            self.call_deadline(),
            self.locker.request_timeout,
            || {
                let (mut c, txn) = (self.locker.kv.clone(), txn.clone());
                async move { c.txn(txn).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        Ok(())
    }

    fn guard_cleanup(&self) -> Vec<TxnOp> {
        self.guard
            .as_ref()
            .map(|g| g.cleanup.clone())
            .unwrap_or_default()
    }

    /// The deadline of one etcd call: the wait's deadline, but never less than
    /// [`CALL_TIMEOUTS`] request timeouts from now. The wait bounds waiting, not the
    /// calls: a call cut short may have committed a grant that would then be undone.
    fn call_deadline(&self) -> Instant {
        self.deadline
            .max(Instant::now() + self.locker.request_timeout * CALL_TIMEOUTS)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        retry::call(
            "acquire.txn",
            self.call_deadline(),
            self.locker.request_timeout,
            || {
                let (mut c, txn) = (self.locker.kv.clone(), txn.clone());
                async move { c.txn(txn).await }
            },
        )
        .await
        .map_err(|e| e.into_caller_error(ErrorKind::QuorumLost))
    }

    /// The cancel marker to write when cleaning up, if a Txn may still arrive.
    fn marker(&self) -> Option<String> {
        self.unsettled
            .load(Ordering::SeqCst)
            .then(|| self.keys.cancel_marker(self.session.lease(), self.request))
    }

    /// Sends `inner` wrapped in `if create_revision(cancel marker) == 0`, and returns
    /// the outer response (its header is the Txn's) and `inner`'s own response (whether
    /// it succeeded, and what its branch read). A
    /// copy of it that etcd applies after a cleanup that wrote the marker does nothing.
    /// The marker only ever exists once the attempt was dropped or failed, so the
    /// wrapper fails only for a stale copy.
    async fn guarded_txn(&self, inner: Txn) -> Result<(TxnResponse, TxnResponse)> {
        self.guarded_txn_with(|| inner.clone(), None).await
    }

    /// [`Attempt::guarded_txn`], with a caller's [`TxnGuard`] added to the outer Txn.
    /// `inner` builds the inner Txn: once for the first send, and again for each
    /// retry, so the common case (one send) keeps no copy of it.
    async fn guarded_txn_with(
        &self,
        inner: impl Fn() -> Txn,
        guard: Option<&TxnGuard>,
    ) -> Result<(TxnResponse, TxnResponse)> {
        // The namespace's rehome fence: no waiter key or grant is created in a fenced
        // namespace (a grant needs a waiter key or this Txn), so once a rehome has seen
        // the namespace's holds and waiters gone after fencing it, this cluster grants
        // nothing more in it.
        let fence = self.locker.keys.ns_fence(&self.name.ns);
        let build = || {
            let marker = self.keys.cancel_marker(self.session.lease(), self.request);
            let mut when = vec![
                Compare::create_revision(marker, CompareOp::Equal, 0),
                Compare::create_revision(fence.as_str(), CompareOp::Equal, 0),
            ];
            let mut then = Vec::new();
            let mut or_else = Vec::new();
            if let Some(g) = guard {
                when.extend(g.when.iter().cloned());
                then.extend(g.then.iter().cloned());
                or_else.extend(g.or_else.iter().cloned());
            }
            or_else.push(TxnOp::get(
                fence.as_str(),
                Some(etcd_client::GetOptions::new().with_count_only()),
            ));
            then.push(TxnOp::txn(inner()));
            Txn::new().when(when).and_then(then).or_else(or_else)
        };
        let was_unsettled = self.unsettled.swap(true, Ordering::SeqCst);
        let sends = AtomicUsize::new(0);
        let resp = retry::call(
            "acquire.grant_or_enqueue",
            self.call_deadline(),
            self.locker.request_timeout,
            || {
                sends.fetch_add(1, Ordering::SeqCst);
                let (mut c, txn) = (self.locker.kv.clone(), build());
                async move { c.txn(txn).await }
            },
        )
        .await
        .map_err(|e| e.into_caller_error(ErrorKind::QuorumLost))?;
        if !was_unsettled && sends.load(Ordering::SeqCst) == 1 {
            // The one copy sent was applied and answered: nothing can arrive later.
            self.unsettled.store(false, Ordering::SeqCst);
        }
        if !resp.succeeded() {
            let mut reads = resp.op_responses();
            let fenced = matches!(reads.pop(), Some(TxnOpResponse::Get(g)) if g.count() > 0);
            if fenced {
                return Err(Error::new(ErrorKind::NamespaceFenced {
                    ns: self.name.ns.clone(),
                }));
            }
            if let Some(g) = guard {
                *g.failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reads);
            }
            return Err(Error::new(ErrorKind::Etcd));
        }
        match resp.op_responses().into_iter().last() {
            Some(TxnOpResponse::Txn(inner)) => Ok((resp, inner)),
            _ => Err(Error::new(ErrorKind::Etcd)),
        }
    }

    fn epoch_compare(&self) -> Compare {
        Compare::mod_revision(
            self.locker.keys.epoch(),
            CompareOp::Equal,
            self.epoch_mod_rev,
        )
    }

    /// The grant's writes: the hold key on the session's lease, and the grant record
    /// where the class needs one ([`needs_grant_record`]).
    fn grant_ops(&self) -> Vec<TxnOp> {
        let lease = self.session.lease();
        let mut ops = Vec::with_capacity(2);
        ops.push(TxnOp::put(
            self.keys.hold(self.mode, lease),
            self.meta.clone(),
            Some(PutOptions::new().with_lease(lease.get())),
        ));
        if needs_grant_record(&self.class) {
            ops.push(TxnOp::put(
                self.keys.grant(self.mode, lease),
                self.meta.clone(),
                None,
            ));
        }
        ops
    }

    /// The first Txn (inside the cancel marker's guard). Fast path: no conflicting
    /// hold, no waiter, no unconsumed grant record (an expired or forced hold whose
    /// lock-delay may apply) -> hold; else enqueue and read the lock. Ranges bounded to
    /// the lease-key shape (see `LockKeys::lease_range`).
    fn first_txn(&self) -> Txn {
        let k = &self.keys;
        let empty = |sub: char, mode: Mode| {
            let (start, end) = k.lease_range(sub, mode);
            Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
        };
        let mut when = vec![self.epoch_compare()];
        let conflicting: &[Mode] = match self.mode {
            Mode::Exclusive => &[Mode::Exclusive, Mode::Shared],
            Mode::Shared => {
                // No shared hold or waiter of this session's (the exclusive ranges
                // below cover its exclusive ones): its keys are decided on in the loop.
                let lease = self.session.lease();
                when.extend([
                    Compare::create_revision(k.hold(Mode::Shared, lease), CompareOp::Equal, 0),
                    Compare::create_revision(k.waiter(Mode::Shared, lease), CompareOp::Equal, 0),
                ]);
                &[Mode::Exclusive]
            }
        };
        for &m in conflicting {
            when.extend([empty('h', m), empty('q', m), empty('g', m)]);
        }
        // Not granted: the same Txn enqueues and reads the lock (its queue with our
        // waiter key in it, holds, grant records, epoch key) at its own revision, so
        // the waiter loop starts without a separate read.
        let mut or_else = vec![self.enqueue_op()];
        or_else.extend(self.view_ops());
        Txn::new()
            .when(when)
            .and_then(self.grant_ops())
            .or_else(or_else)
    }

    async fn run(&self) -> Result<Option<(Revision, FencingToken)>> {
        let hw = self.locker.epoch.high_water();
        let (resp, inner) = self
            .guarded_txn_with(|| self.first_txn(), self.guard.as_deref())
            .await?;
        if inner.succeeded() {
            return self.mint(&resp, hw, true).await;
        }
        self.locker.epoch.check(resp.header(), hw, false)?;
        let mut ops = inner.op_responses().into_iter();
        let header_rev = resp.header().map_or(0, |h| h.revision());
        let mut view = if self.enqueued(header_rev, ops.next()).await? {
            self.read().await?
        } else {
            self.parse_view(&resp, ops)?
        };
        let mut first_seen: HashMap<(Vec<u8>, i64), Instant> = HashMap::new();
        // Grant Txns that failed in a row on a state read just before. Each failure
        // returns the state that made it fail and the loop decides again on it at once;
        // only a run of them (the state changing under us again and again, which a FIFO
        // queue does not produce) backs off, 20 ms doubling, so etcd is never spun on.
        let mut raced = 0u32;
        let mut backoff = retry::Backoff::new();
        loop {
            if self.session.loss().is_some() {
                return Err(Error::new(ErrorKind::SessionLost));
            }
            match self.step(view, &mut first_seen).await? {
                Step::Granted(g) => return Ok(g),
                Step::Next(v) => {
                    raced = 0;
                    backoff = retry::Backoff::new();
                    view = v;
                }
                Step::Raced(v) => {
                    raced += 1;
                    if raced >= RACES_BEFORE_BACKOFF && Instant::now() >= self.deadline {
                        // The state keeps changing under a wait that has no time left.
                        return Err(Error::new(ErrorKind::DeadlineExceeded));
                    }
                    view = if raced >= RACES_BEFORE_BACKOFF {
                        backoff.wait(self.deadline).await;
                        self.read().await?
                    } else {
                        v
                    };
                }
            }
        }
    }

    /// Checks a succeeded grant's header against the epoch, waits until the durable
    /// reservation covers its revision (at once, mostly), and mints the token. A grant refused by the epoch check is
    /// undone before the error is reported.
    async fn mint(
        &self,
        resp: &TxnResponse,
        hw_at_send: u64,
        is_grant: bool,
    ) -> Result<Option<(Revision, FencingToken)>> {
        let header = resp.header().ok_or_else(|| Error::new(ErrorKind::Etcd))?;
        self.locker
            .epoch
            .check(Some(header), hw_at_send, is_grant)?;
        self.finish(
            Revision::from_i64(header.revision())
                .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?,
        )
        .await
    }

    async fn finish(&self, grant_rev: Revision) -> Result<Option<(Revision, FencingToken)>> {
        self.locker.epoch.commit(self.epoch, grant_rev).await?;
        // Only a revision of 2^48 or more fails here: etcd itself would need a new epoch.
        let token = FencingToken::from_parts(self.epoch, grant_rev)
            .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?;
        Ok(Some((grant_rev, token)))
    }
}
