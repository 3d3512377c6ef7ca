//! The waiter loop, on the lock's keys read at one revision (keys only): adopt a grant
//! whose answer was lost, clean up a leftover hold, wait on the predecessor's release,
//! or grant in one Txn whose else branch reads the lock for the next round.

use std::collections::{HashMap, HashSet};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchResponse,
};
use palisade_fence::{FencingToken, Revision};
use tokio::time::Instant;

use super::Attempt;
use crate::error::{Error, ErrorKind, Result};
use crate::handover::{oldest_waiter_op, oldest_waiter_options, Successor};
use crate::lock_watch::{LockSubscription, QUIET_TIMEOUTS};
use crate::model::Mode;
use crate::retry;

/// One key of the lock's queue, holds or grant records, read without its value.
pub(super) struct Entry {
    key: Vec<u8>,
    create_rev: i64,
    mod_rev: i64,
    lease: i64,
}

impl From<&KeyValue> for Entry {
    fn from(kv: &KeyValue) -> Self {
        Entry {
            key: kv.key().to_vec(),
            create_rev: kv.create_revision(),
            mod_rev: kv.mod_revision(),
            lease: kv.lease(),
        }
    }
}

/// The lock's state read at one revision.
pub(super) struct View {
    revision: i64,
    queue: Vec<Entry>,
    holds: Vec<Entry>,
    grants: Vec<Entry>,
    epoch_mod_rev: i64,
}

/// Which grant records a grant Txn allows in the ranges that conflict with it.
#[derive(Clone, Copy)]
enum NoGrantRecords {
    /// None created or changed since the view was read (its orphans, deleted by the
    /// Txn, are all there are).
    SinceView,
    /// None at all.
    Required,
}

/// How a wait on a blocker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// What it waited on is gone.
    Released,
    /// The watch stream failed or was cancelled; nothing is known.
    WatchFailed,
    /// The predecessor's release handed the lock over: this attempt's hold key was
    /// put at this revision.
    HandedOver(i64),
}

/// Who wrote a hold key of this session that a view found.
enum OwnHold {
    /// This attempt: its grant committed, the answer was lost.
    Ours,
    /// An earlier acquire of the session whose release did not get through.
    Earlier,
    /// The key is gone or was written again since the view: read anew.
    Changed,
}

pub(super) enum Step {
    /// Granted (or adopted); `None` never happens here (unprotected grants are made by
    /// the caller).
    Granted(Option<(Revision, FencingToken)>),
    /// Waited for a blocker, slept for lock-delay, or repaired the queue; the state read
    /// since, to decide on next.
    Next(View),
    /// A grant Txn built on a fresh state failed its compares; the state it read instead
    /// (its `else` branch), at its revision.
    Raced(View),
}

impl Attempt {
    /// The reads of a [`View`], as Txn ops: `q/`, `h/`, `g/` and the epoch key. Put in
    /// the `else` branch of the enqueue and grant Txns, so that a Txn that does not
    /// grant returns the state that made it fail, in the same round trip.
    /// Keys only: what the loop decides on is which keys exist and their revisions (a
    /// queue of 64 waiters is 64 keys, not 64 holder metas to send and parse). The one
    /// value it needs, the `attempt` of a hold of this session, is read on its own when
    /// there is one (see [`Attempt::own_hold_attempt`]).
    pub(super) fn view_ops(&self) -> [TxnOp; 4] {
        let k = &self.keys;
        let prefix =
            |p: String| TxnOp::get(p, Some(GetOptions::new().with_prefix().with_keys_only()));
        [
            prefix(k.queue()),
            prefix(k.holds()),
            prefix(k.grants()),
            TxnOp::get(
                self.locker.keys.epoch(),
                Some(GetOptions::new().with_keys_only()),
            ),
        ]
    }

    /// Parses the responses of [`Attempt::view_ops`] (in that order), read by the Txn
    /// whose response is `resp`.
    pub(super) fn parse_view(
        &self,
        resp: &TxnResponse,
        ops: impl Iterator<Item = TxnOpResponse>,
    ) -> Result<View> {
        let k = &self.keys;
        // Only keys inside the bounded lease-key ranges count, as in the compares; a
        // stray key elsewhere under `q/`, `h/` or `g/` is ignored.
        let mut gets = ops.map(|r| match r {
            TxnOpResponse::Get(g) => Ok(g
                .kvs()
                .iter()
                .filter(|kv| {
                    k.in_lease_ranges(kv.key()) || kv.key() == self.locker.keys.epoch().as_bytes()
                })
                .map(Entry::from)
                .collect::<Vec<_>>()),
            _ => Err(Error::new(ErrorKind::Etcd)),
        });
        let mut next = || {
            gets.next()
                .unwrap_or_else(|| Err(Error::new(ErrorKind::Etcd)))
        };
        let (queue, holds, grants, epoch) = (next()?, next()?, next()?, next()?);
        Ok(View {
            revision: resp.header().map(|h| h.revision()).unwrap_or(0),
            queue,
            holds,
            grants,
            epoch_mod_rev: epoch.first().map(|e| e.mod_rev).unwrap_or(0),
        })
    }

    pub(super) async fn read(&self) -> Result<View> {
        let resp = self.read_txn(self.view_ops()).await?;
        self.parse_view(&resp, resp.op_responses().into_iter())
    }

    /// One round of the waiter loop on `view`: adopt, repair, wait, or try to grant.
    pub(super) async fn step(
        &self,
        view: View,
        first_seen: &mut HashMap<(Vec<u8>, i64), Instant>,
    ) -> Result<Step> {
        if view.epoch_mod_rev != self.epoch_mod_rev {
            // This locker advanced the epoch since the attempt began, or another locker
            // did and both records agree on the new epoch (adopted): the attempt is
            // stale, the locker is not. Otherwise this locker refuses grants.
            if view.epoch_mod_rev == self.locker.epoch.snapshot().etcd_mod_rev
                || self.locker.adopt_advanced_epoch().await
            {
                return Err(Error::epoch(crate::error::EpochMismatch::Advanced));
            }
            return Err(self.locker.epoch.advanced_elsewhere());
        }
        let lease = self.session.lease();
        let k = &self.keys;
        let (my_hold, my_waiter) = (
            k.hold(self.mode, lease).into_bytes(),
            k.waiter(self.mode, lease).into_bytes(),
        );
        if let Some(h) = view
            .holds
            .iter()
            .find(|h| h.key == my_hold && h.lease == lease.get())
        {
            match self.own_hold_attempt(h.create_rev).await? {
                OwnHold::Ours => {
                    // This attempt's grant committed but its answer was lost (a retried
                    // Txn): adopt.
                    let rev = Revision::from_i64(h.create_rev)
                        .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?;
                    let _ = self
                        .txn(Txn::new().and_then([TxnOp::delete(my_waiter, None)]))
                        .await;
                    return self.finish(rev).await.map(Step::Granted);
                }
                OwnHold::Changed => return Ok(Step::Next(self.read().await?)),
                OwnHold::Earlier => {}
            }
        }
        if let Some(stale) = view.holds.iter().find(|h| h.lease == lease.get()) {
            // A hold of this session left by an earlier acquire whose release did not get
            // through (its `Hold` is gone, so the caller already let it go): finish that
            // release, so it neither blocks us nor gets its token handed out again.
            let txn = Txn::new()
                .when([Compare::create_revision(
                    stale.key.clone(),
                    CompareOp::Equal,
                    stale.create_rev,
                )])
                .and_then([
                    TxnOp::delete(stale.key.clone(), None),
                    TxnOp::delete(k.grant_for_hold(&stale.key), None),
                ]);
            self.txn(txn).await?;
            return Ok(Step::Next(self.read().await?));
        }
        let Some(mine) = view
            .queue
            .iter()
            .find(|w| w.key == my_waiter)
            .map(|w| w.create_rev)
        else {
            // Our waiter key is gone (lease expired, or deleted by someone): enqueue again
            // at the back; a dead lease makes the put fail with SessionLost. Guarded by the
            // cancel marker like the first Txn, so a late copy cannot outlive a cleanup.
            let put = TxnOp::put(
                my_waiter,
                self.meta.clone(),
                Some(PutOptions::new().with_lease(self.lease())),
            );
            self.guarded_txn(Txn::new().and_then([put])).await?;
            return Ok(Step::Next(self.read().await?));
        };
        let x_prefix = |p: String| move |e: &&Entry| e.key.starts_with(p.as_bytes());
        let is_x_waiter = x_prefix(k.queue_of(Mode::Exclusive));
        let is_x_hold = x_prefix(k.holds_of(Mode::Exclusive));
        let blocker = match self.mode {
            Mode::Exclusive => view
                .queue
                .iter()
                .filter(|w| w.create_rev < mine)
                .max_by_key(|w| w.create_rev)
                .or(view.holds.first()),
            Mode::Shared => view
                .queue
                .iter()
                .filter(|w| w.create_rev < mine)
                .filter(&is_x_waiter)
                .max_by_key(|w| w.create_rev)
                .or(view.holds.iter().find(&is_x_hold)),
        };
        // Grant records whose hold is gone: the hold ended by expiry or force.
        let live: HashSet<Vec<u8>> = view.holds.iter().map(|h| h.key.clone()).collect();
        let relevant = match self.mode {
            Mode::Exclusive => k.grants(),
            Mode::Shared => k.grants_of(Mode::Exclusive),
        };
        let orphans: Vec<&Entry> = view
            .grants
            .iter()
            .filter(|g| g.key.starts_with(relevant.as_bytes()))
            .filter(|g| {
                k.hold_for_grant(&g.key)
                    .is_some_and(|h| !live.contains(h.as_bytes()))
            })
            .collect();
        if let Some(b) = blocker {
            let woken = self.wait_released(b, &view).await?;
            if let Woken::HandedOver(rev) = woken {
                return self.adopt_handed_over(rev).await;
            }
            if woken == Woken::WatchFailed || !orphans.is_empty() {
                // A failed watch stream (a member went away, the cluster was restored)
                // is followed by a read, whose answer is checked against the epoch,
                // never straight by a grant Txn that might be applied in a cluster this
                // locker must refuse. And lock-delay has to be timed on orphans first
                // (its clock starts when this waiter first sees one with nothing ahead
                // of it). Either way: read anew.
                return Ok(Step::Next(self.read().await?));
            }
            // What let us go is most often the blocker's release, after which we are
            // first: try the grant at once, on the state read before the wait, with no
            // grant record allowed at all (the blocker's, left by an expiry or a force
            // release, is an orphan whose lock-delay has not been timed). Every compare
            // is checked against etcd's current state; if one fails, the Txn's `else`
            // branch is the state to go on with, so this costs no round trip over
            // reading first.
            return self
                .grant(&view, mine, &[], NoGrantRecords::Required)
                .await
                .map(|s| match s {
                    Step::Raced(v) => Step::Next(v),
                    s => s,
                });
        }
        if !orphans.is_empty() && !self.class.lock_delay.is_zero() {
            let now = Instant::now();
            let ready = orphans
                .iter()
                .map(|o| {
                    *first_seen.entry((o.key.clone(), o.mod_rev)).or_insert(now)
                        + self.class.lock_delay
                })
                .max()
                .unwrap_or(now);
            if now < ready {
                self.sleep_until(ready).await?;
                return Ok(Step::Next(self.read().await?));
            }
        }
        self.grant(&view, mine, &orphans, NoGrantRecords::SinceView)
            .await
    }

    /// The grant Txn on `view`, for the waiter key created at `mine`, deleting the
    /// grant records `orphans` (whose lock-delay has passed). Granted: the token. Not:
    /// [`Step::Raced`] with the state its `else` branch read.
    async fn grant(
        &self,
        view: &View,
        mine: i64,
        orphans: &[&Entry],
        records: NoGrantRecords,
    ) -> Result<Step> {
        let k = &self.keys;
        let lease = self.session.lease();
        let (my_hold, my_waiter) = (
            k.hold(self.mode, lease).into_bytes(),
            k.waiter(self.mode, lease).into_bytes(),
        );
        let ranges = |sub: char, modes: &[Mode]| -> Vec<(String, Vec<u8>)> {
            modes.iter().map(|&m| k.lease_range(sub, m)).collect()
        };
        let both = [Mode::Exclusive, Mode::Shared];
        let relevant_modes: &[Mode] = match self.mode {
            Mode::Exclusive => &both,
            Mode::Shared => &[Mode::Exclusive],
        };
        let mut when = vec![
            Compare::create_revision(my_waiter.clone(), CompareOp::Equal, mine),
            self.epoch_compare(),
        ];
        for (start, end) in ranges('g', relevant_modes) {
            when.push(match records {
                // No grant record created or changed since the read: the orphans seen
                // are all.
                NoGrantRecords::SinceView => {
                    Compare::mod_revision(start, CompareOp::Less, view.revision + 1).with_range(end)
                }
                NoGrantRecords::Required => {
                    Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
                }
            });
        }
        // No hold that conflicts.
        for (start, end) in ranges('h', relevant_modes) {
            when.push(Compare::create_revision(start, CompareOp::Equal, 0).with_range(end));
        }
        if self.mode == Mode::Shared {
            // No leftover shared hold of this lease (a put would keep its old create
            // revision, and the token would not match the key).
            when.push(Compare::create_revision(
                my_hold.clone(),
                CompareOp::Equal,
                0,
            ));
        }
        // Every waiter that could block this one was created after it (exclusive: every
        // waiter; shared: every exclusive waiter). An empty range compares as 0, so a
        // mode with no waiter at the read needs the form "none at all".
        for &m in relevant_modes {
            let (start, end) = k.lease_range('q', m);
            let prefix = k.queue_of(m);
            let any = view
                .queue
                .iter()
                .any(|w| w.key.starts_with(prefix.as_bytes()));
            when.push(if !any {
                Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
            } else if self.mode == Mode::Exclusive {
                // Mine is in the exclusive range: at or after mine.
                Compare::create_revision(start, CompareOp::Greater, mine - 1).with_range(end)
            } else {
                Compare::create_revision(start, CompareOp::Greater, mine).with_range(end)
            });
        }
        let my_grant = k.grant(self.mode, lease).into_bytes();
        let mut ops = vec![TxnOp::delete(my_waiter, None)];
        ops.extend(self.grant_ops());
        ops.extend(
            orphans
                .iter()
                .filter(|o| o.key != my_grant)
                .map(|o| TxnOp::delete(o.key.clone(), None)),
        );
        if self.mode == Mode::Exclusive {
            // Whom the release hands over to: the oldest waiter once ours is gone.
            ops.push(oldest_waiter_op(k));
        }
        let hw = self.locker.epoch.high_water();
        let resp = self
            .txn(Txn::new().when(when).and_then(ops).or_else(self.view_ops()))
            .await?;
        if !resp.succeeded() {
            self.locker.epoch.check(resp.header(), hw, false)?;
            let view = self.parse_view(&resp, resp.op_responses().into_iter())?;
            tracing::debug!(lock = ?self.name, revision = view.revision, "grant Txn raced");
            return Ok(Step::Raced(view));
        }
        let granted = self.mint(&resp, hw, true).await?;
        if self.mode == Mode::Exclusive {
            if let Some(TxnOpResponse::Get(g)) = resp.op_responses().into_iter().last() {
                self.set_successor(g.kvs().first());
            }
        }
        Ok(Step::Granted(granted))
    }

    /// Notes whom the hold's release hands over to, from a read of the oldest waiter.
    fn set_successor(&self, oldest: Option<&KeyValue>) {
        // Never this attempt's own waiter key, should it still be there.
        let oldest = oldest.filter(|kv| kv.lease() != self.session.lease().get());
        let s = Successor::from_oldest(&self.keys, oldest, self.epoch.get(), self.epoch_mod_rev);
        *self
            .successor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
    }

    /// The release of the predecessor handed the lock to this waiter: its hold key was
    /// put at `rev` (seen by the lock's watch, or by a read of the wait's keys, both above the
    /// view this waiter waited on). Confirms it with a read checked against the epoch:
    /// the hold key is still this attempt's (create revision `rev`, this attempt's meta,
    /// this lease) and the epoch key is still at this attempt's mod revision, which the
    /// hand-over compared too; the same read finds whom this hold hands over to next.
    /// Anything else: read anew and decide on that (a hold of ours that is no longer as
    /// handed over, or an epoch that moved, is dealt with by the loop).
    async fn adopt_handed_over(&self, rev: i64) -> Result<Step> {
        let lease = self.session.lease();
        let k = &self.keys;
        let ops = |serializable: bool| {
            let opts = |o: GetOptions| {
                if serializable {
                    o.with_serializable()
                } else {
                    o
                }
            };
            vec![
                TxnOp::get(k.hold(self.mode, lease), Some(opts(GetOptions::new()))),
                TxnOp::get(
                    self.locker.keys.epoch(),
                    Some(opts(GetOptions::new().with_keys_only())),
                ),
                TxnOp::get(k.queue(), Some(opts(oldest_waiter_options()))),
            ]
        };
        // Served by the member the client picked, without a read index through the
        // leader (etcd's serializable read). What it decides on is a past write, the
        // grant at `rev`: any committed state at or after `rev` in which the hold is
        // still ours and the epoch key still at this attempt's mod revision shows that
        // the grant stands, as a linearizable read would. So it is used only from a
        // member that applied `rev` and every revision this locker has seen (its
        // header passes the epoch's rollback check as a linearizable answer would);
        // from a member behind either, a follower that lags, the read is sent again,
        // linearizable.
        let hw = self.locker.epoch.high_water();
        let resp = self.txn(Txn::new().and_then(ops(true))).await?;
        let resp = if caught_up(resp.header().map(|h| h.revision()), rev, hw) {
            self.locker.epoch.check(resp.header(), hw, false)?;
            resp
        } else {
            self.read_txn(ops(false)).await?
        };
        let mut gets = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        let (hold, epoch, oldest) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        let ours = hold.is_some_and(|h| {
            h.create_revision() == rev
                && h.lease() == lease.get()
                && h.value() == self.meta.as_slice()
        });
        if !ours || epoch.map(|e| e.mod_revision()) != Some(self.epoch_mod_rev) {
            return Ok(Step::Next(self.read().await?));
        }
        let granted = self
            .finish(Revision::from_i64(rev).map_err(|e| Error::with_source(ErrorKind::Etcd, e))?)
            .await?;
        self.set_successor(oldest.as_ref());
        tracing::debug!(lock = ?self.name, revision = rev, "handed over at release");
        Ok(Step::Granted(granted))
    }

    /// Sends `ops` (reads) in one Txn and checks its answer against the epoch, like every
    /// read the waiter decides on.
    async fn read_txn(&self, ops: impl Into<Vec<TxnOp>>) -> Result<TxnResponse> {
        let hw = self.locker.epoch.high_water();
        let resp = self.txn(Txn::new().and_then(ops.into())).await?;
        self.locker.epoch.check(resp.header(), hw, false)?;
        Ok(resp)
    }

    /// Reads this session's hold key of the lock, which a view listed (keys only) as
    /// created at `create_rev`, and tells whether this attempt wrote it (its `attempt`
    /// in the stored meta; a grant whose answer was lost) or an earlier acquire of the
    /// session did.
    /// The same read finds the oldest waiter, whom the hold hands over to if it is
    /// ours (a hand-over whose put this waiter did not see before it woke comes this way).
    async fn own_hold_attempt(&self, create_rev: i64) -> Result<OwnHold> {
        let hold = self.keys.hold(self.mode, self.session.lease());
        let resp = self
            .read_txn([TxnOp::get(hold, None), oldest_waiter_op(&self.keys)])
            .await?;
        let mut gets = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => Ok(g.kvs().first().cloned()),
            _ => Err(Error::new(ErrorKind::Etcd)),
        });
        let (kv, oldest) = (
            gets.next().transpose()?.flatten(),
            gets.next().transpose()?.flatten(),
        );
        let Some(kv) = kv.filter(|kv| kv.create_revision() == create_rev) else {
            return Ok(OwnHold::Changed);
        };
        let attempt = serde_json::from_slice::<serde_json::Value>(kv.value())
            .ok()
            .and_then(|v| v.get("attempt").and_then(serde_json::Value::as_u64));
        if attempt != Some(self.id) {
            return Ok(OwnHold::Earlier);
        }
        if self.mode == Mode::Exclusive {
            self.set_successor(oldest.as_ref());
        }
        Ok(OwnHold::Ours)
    }

    async fn sleep_until(&self, until: Instant) -> Result<()> {
        tokio::select! {
            _ = tokio::time::sleep_until(until.min(self.deadline)) => {
                if until > self.deadline { Err(Error::new(ErrorKind::DeadlineExceeded)) } else { Ok(()) }
            }
            _ = self.session.lost() => Err(Error::new(ErrorKind::SessionLost)),
        }
    }

    /// Waits until `blocker` (an entry of the view) no longer blocks this waiter.
    ///
    /// A hold blocks until its key is deleted. A waiter blocks until its key is deleted
    /// and its lease's hold key (created in the same Txn when that waiter is granted) is
    /// gone too: so the wait is on what actually lets this waiter go, the predecessor's
    /// release, and not on its grant, which would cost another read and another wait.
    /// Only the predecessor's two keys (and this attempt's own hold key, for a
    /// hand-over) wake this waiter, so a release wakes one waiter: no thundering herd.
    /// The writes to them come from the locker's one watch on the lock, shared by all
    /// its waiters there (see [`crate::lock_watch`]): joining it costs no round trip,
    /// and only the first waiter of a lock creates it, on a shared stream (see
    /// [`crate::watches`]), from etcd's current revision, never a past one (etcd serves
    /// a watch that starts in the past from its "unsynced" group, which it catches up
    /// only every 100 ms).
    ///
    /// Every write to the keys after [`LockSubscription::covered_from`] is passed on.
    /// When the view is at or after that revision, the view is the state to start from;
    /// else (the watch was created after the view, or the messages it kept no longer
    /// reach back to it) the keys are read once, in one Txn of a few gets, and only
    /// events after that read's revision are applied. Any trouble with the watch returns
    /// [`Woken::WatchFailed`] early (after a short backoff): the caller reads anew.
    async fn wait_released(&self, blocker: &Entry, view: &View) -> Result<Woken> {
        let (hold_key, waiter_key): (Vec<u8>, Option<Vec<u8>>) =
            match self.keys.hold_for_waiter(&blocker.key) {
                Some(hold) => (hold.into_bytes(), Some(blocker.key.clone())),
                None => (blocker.key.clone(), None),
            };
        // The blocking waiter key and the create revision the view saw.
        let waiter = waiter_key.as_deref().map(|k| (k, blocker.create_rev));
        // This attempt's own hold key: put when a release hands the lock over to it.
        let own_hold = self.keys.hold(self.mode, self.session.lease()).into_bytes();
        let mut wanted = vec![hold_key.clone()];
        if self.mode == Mode::Exclusive {
            // Only exclusive waiters are handed over to.
            wanted.push(own_hold.clone());
        }
        if let Some(key) = &waiter_key {
            wanted.push(key.clone());
        }
        let subscribe = retry::call(
            "acquire.watch",
            self.deadline,
            self.locker.request_timeout,
            || {
                self.locker.lock_watches.subscribe(
                    &self.locker.watches,
                    &self.keys,
                    wanted.clone(),
                    view.revision,
                )
            },
        );
        let mut stream = subscribe
            .await
            .map_err(|e| e.into_caller_error(ErrorKind::QuorumLost))?;
        self.locker.epoch.observe_header(Some(stream.created()))?;
        let (mut seen, mut hold_present, mut waiter_present);
        if stream.covered_from() <= view.revision {
            // Every write to the keys after the view is passed on: the view is the state
            // to start from (it had no hold of ours).
            seen = view.revision;
            hold_present = view.holds.iter().any(|h| h.key == hold_key);
            waiter_present = waiter.is_some();
        } else {
            let read = self.read_wait_keys(&hold_key, &own_hold, waiter).await?;
            if let Some(own) = read.own {
                return Ok(self.own_hold_seen(&own, view));
            }
            (seen, hold_present, waiter_present) =
                (read.revision, read.hold_present, read.waiter_present);
        }
        // How long the lock's watch may stay silent before this waiter reads its keys
        // anyway (a watch whose member stopped passing writes on would otherwise keep
        // every waiter of the locker on the lock waiting until its deadline).
        let quiet = self.locker.request_timeout * QUIET_TIMEOUTS;
        let mut recheck_at = Instant::now() + quiet;
        let mut pending: Vec<WatchEvent> = Vec::new();
        loop {
            // A message holds every event of its revision: a grant's waiter-key delete
            // and hold put, or a release's hold delete and the hand-over's put, come
            // together, so the state after a message is a state etcd was in.
            let mut handed = None;
            for WatchEvent {
                key,
                kind,
                rev,
                handed_over,
            } in pending.drain(..)
            {
                if rev <= seen {
                    continue;
                }
                if key == own_hold {
                    if handed_over {
                        handed = Some(rev);
                    }
                } else if key == hold_key {
                    hold_present = kind == EventType::Put;
                } else if waiter_key.as_ref() == Some(&key) && kind == EventType::Delete {
                    waiter_present = false;
                }
            }
            if let Some(rev) = handed {
                return Ok(Woken::HandedOver(rev));
            }
            if !hold_present && !waiter_present {
                return Ok(Woken::Released);
            }
            match self.next_watch_message(&mut stream, recheck_at).await? {
                Next::Message(resp) if !resp.canceled() => pending.extend(self.events(&resp)),
                Next::Message(_) | Next::Ended => return self.watch_trouble().await,
                Next::Quiet => {
                    let heard = stream.last_message();
                    if heard + quiet > Instant::now() {
                        // The watch is alive (it passed a write on, for some waiter).
                        recheck_at = heard + quiet;
                        continue;
                    }
                    let read = self.read_wait_keys(&hold_key, &own_hold, waiter).await?;
                    if let Some(own) = read.own {
                        return Ok(self.own_hold_seen(&own, view));
                    }
                    if (read.hold_present, read.waiter_present) != (hold_present, waiter_present) {
                        tracing::warn!(lock = ?self.name, revision = read.revision, "a silent lock watch missed a write; creating it anew");
                        stream.distrust();
                    }
                    (seen, hold_present, waiter_present) = (
                        seen.max(read.revision),
                        read.hold_present,
                        read.waiter_present,
                    );
                    recheck_at = Instant::now() + quiet;
                }
            }
        }
    }

    /// Reads the keys a wait is on, in one Txn checked against the epoch: the blocking
    /// hold key, this attempt's own hold key (with its value) and, when the blocker is a
    /// waiter, its waiter key (`waiter`: the key and the create revision it had).
    async fn read_wait_keys(
        &self,
        hold_key: &[u8],
        own_hold: &[u8],
        waiter: Option<(&[u8], i64)>,
    ) -> Result<WaitKeys> {
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let mut ops = vec![
            TxnOp::get(hold_key, keys_only()),
            TxnOp::get(own_hold, None),
        ];
        if let Some((key, _)) = waiter {
            ops.push(TxnOp::get(key, keys_only()));
        }
        let resp = self.read_txn(ops).await?;
        let mut got = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        Ok(WaitKeys {
            revision: resp.header().map(|h| h.revision()).unwrap_or(0),
            hold_present: got.next().flatten().is_some(),
            own: got.next().flatten(),
            waiter_present: match waiter {
                Some((_, rev)) => got.next().flatten().map(|kv| kv.create_revision()) == Some(rev),
                None => false,
            },
        })
    }

    /// What a hold key of this attempt's, found by a read during a wait, means: a
    /// hand-over if it holds what a hand-over writes and is newer than the view (which
    /// had no hold of ours); anything else is read anew.
    fn own_hold_seen(&self, own: &KeyValue, view: &View) -> Woken {
        if self.is_handed_over(own) && own.create_revision() > view.revision {
            Woken::HandedOver(own.create_revision())
        } else {
            Woken::WatchFailed
        }
    }

    /// The next message of a wait's watch, [`Next::Ended`] if the watch failed or
    /// ended, [`Next::Quiet`] at `recheck_at`; or the deadline, or the session's loss.
    async fn next_watch_message(
        &self,
        stream: &mut LockSubscription,
        recheck_at: Instant,
    ) -> Result<Next> {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(resp) => {
                    self.locker.epoch.observe_header(resp.header())?;
                    Ok(Next::Message(resp))
                }
                None => Ok(Next::Ended),
            },
            _ = tokio::time::sleep_until(recheck_at.min(self.deadline)) => {
                if recheck_at < self.deadline { Ok(Next::Quiet) } else { Err(Error::new(ErrorKind::DeadlineExceeded)) }
            }
            _ = self.session.lost() => Err(Error::new(ErrorKind::SessionLost)),
        }
    }

    /// A watch stream failed or was cancelled (compaction, a member going away): wait a
    /// little so a failing stream is not reopened in a tight loop, and let the caller
    /// decide on a fresh state.
    async fn watch_trouble(&self) -> Result<Woken> {
        retry::Backoff::new().wait(self.deadline).await;
        if Instant::now() >= self.deadline {
            return Err(Error::new(ErrorKind::DeadlineExceeded));
        }
        Ok(Woken::WatchFailed)
    }
}

/// Whether a serializable answer at `header_rev` may be decided on as a linearizable
/// one for a grant at `rev`: its member applied `rev` and reached `hw`, the highest
/// revision this locker saw (below it, [`crate::epoch`]'s rollback check would refuse
/// it; a lagging follower is not a restored etcd, so such an answer is read again).
fn caught_up(header_rev: Option<i64>, rev: i64, hw: u64) -> bool {
    header_rev.is_some_and(|r| r >= rev && u64::try_from(r).is_ok_and(|r| r >= hw))
}

/// What a wait got from its lock's watch.
enum Next {
    Message(WatchResponse),
    /// The watch failed or ended.
    Ended,
    /// Nothing came before the re-check time.
    Quiet,
}

/// The keys a wait is on, read at one revision.
struct WaitKeys {
    revision: i64,
    hold_present: bool,
    /// This attempt's own hold key, if there is one.
    own: Option<KeyValue>,
    /// Whether the blocking waiter key is still there, at the create revision seen.
    waiter_present: bool,
}

/// One event of the lock's watch.
struct WatchEvent {
    key: Vec<u8>,
    kind: EventType,
    /// Its revision (the key's mod revision).
    rev: i64,
    /// Whether it created a hold of this attempt (see [`Attempt::is_handed_over`]).
    handed_over: bool,
}

impl Attempt {
    /// The events of a watch response of this attempt's wait.
    fn events<'a>(&'a self, resp: &'a WatchResponse) -> impl Iterator<Item = WatchEvent> + 'a {
        resp.events().iter().filter_map(|e| {
            let kv = e.kv()?;
            Some(WatchEvent {
                key: kv.key().to_vec(),
                kind: e.event_type(),
                rev: kv.mod_revision(),
                handed_over: e.event_type() == EventType::Put
                    && kv.create_revision() == kv.mod_revision()
                    && self.is_handed_over(kv),
            })
        })
    }

    /// Whether `kv`, this attempt's hold key, holds what a hand-over to this attempt
    /// writes: its meta, on its lease.
    fn is_handed_over(&self, kv: &KeyValue) -> bool {
        kv.lease() == self.session.lease().get() && kv.value() == self.meta.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::caught_up;

    #[test]
    fn a_serializable_answer_counts_only_from_a_member_at_the_grant_and_the_high_water() {
        // At or past both: decided on.
        assert!(caught_up(Some(120), 120, 118));
        assert!(caught_up(Some(130), 120, 130));
        // Behind the high water (a follower that lags): read again, linearizable.
        assert!(!caught_up(Some(125), 120, 126));
        // Behind the grant itself: it cannot show the hold yet.
        assert!(!caught_up(Some(119), 120, 100));
        // No header, or a negative revision: never.
        assert!(!caught_up(None, 120, 0));
        assert!(!caught_up(Some(-1), -5, 0));
    }
}
