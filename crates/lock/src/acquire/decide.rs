//! Deciding: one round of the waiter loop, on the lock's keys read at one revision (keys
//! only): adopt a grant whose answer was lost, clean up a leftover hold, pick the one
//! waiter or holder to wait on (the wait is in `wait.rs`), or grant in one Txn whose
//! else branch reads the lock for the next round.

use std::collections::{HashMap, HashSet};

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use palisade_fence::{FencingToken, Revision};
use tokio::time::Instant;

use super::own::OwnHold;
use super::Attempt;
use crate::error::{Error, ErrorKind, Result};
use crate::handover::{oldest_waiter_op, Successor};
use palisade_api::keys::LockKeys;
use palisade_api::Mode;

/// One key of the lock's queue, holds or grant records, read without its value.
pub(super) struct Entry {
    pub(super) key: Vec<u8>,
    pub(super) create_rev: i64,
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
    pub(super) revision: i64,
    queue: Vec<Entry>,
    pub(super) holds: Vec<Entry>,
    grants: Vec<Entry>,
    epoch_mod_rev: i64,
    /// `q/` and `h/` keys no live session owns (see `crate::stray`): in none of the
    /// lists above, and deleted before the view is decided on.
    strays: Vec<crate::stray::Stray>,
}

/// Splits the `q/` and `h/` entries of a view into the live ones and the strays, by
/// `LockKeys::is_live_entry`.
fn split_live(
    k: &LockKeys,
    queue: Vec<Entry>,
    holds: Vec<Entry>,
) -> (Vec<Entry>, Vec<Entry>, Vec<crate::stray::Stray>) {
    let mut strays = Vec::new();
    let mut live = |entries: Vec<Entry>| -> Vec<Entry> {
        entries
            .into_iter()
            .filter_map(|e| {
                if k.is_live_entry(&e.key, e.lease) {
                    return Some(e);
                }
                strays.push(crate::stray::Stray {
                    key: e.key,
                    mod_rev: e.mod_rev,
                    lease: e.lease,
                });
                None
            })
            .collect()
    };
    let (queue, holds) = (live(queue), live(holds));
    (queue, holds, strays)
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

/// How a wait on a blocker ended (see `wait.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    /// What it waited on is gone.
    Released,
    /// The watch stream failed or was cancelled; nothing is known.
    WatchFailed,
    /// The predecessor's release handed the lock over: this attempt's hold key was
    /// put at this revision.
    HandedOver(i64),
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
        let epoch_key = self.locker.keys.epoch();
        // Only keys inside the bounded lease-key ranges count, as in the compares; a
        // stray key elsewhere under `q/`, `h/` or `g/` is ignored.
        let mut gets = ops.map(|r| match r {
            TxnOpResponse::Get(g) => Ok(g
                .kvs()
                .iter()
                .filter(|kv| k.in_lease_ranges(kv.key()) || kv.key() == epoch_key.as_bytes())
                .map(Entry::from)
                .collect::<Vec<_>>()),
            _ => Err(Error::new(ErrorKind::Etcd)),
        });
        let mut next = || {
            gets.next()
                .unwrap_or_else(|| Err(Error::new(ErrorKind::Etcd)))
        };
        let (queue, holds, grants, epoch) = (next()?, next()?, next()?, next()?);
        let (queue, holds, strays) = split_live(k, queue, holds);
        Ok(View {
            revision: resp.header().map(|h| h.revision()).unwrap_or(0),
            queue,
            holds,
            grants,
            epoch_mod_rev: epoch.first().map(|e| e.mod_rev).unwrap_or(0),
            strays,
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
        if !view.strays.is_empty() {
            // Keys no live session owns never end by themselves and would fail the
            // grant's range compares: delete them, then decide on the lock as it is.
            let some = &view.strays[..view.strays.len().min(crate::stray::PER_TXN)];
            self.txn(crate::stray::delete_txn(some, "acquire")).await?;
            return Ok(Step::Next(self.read().await?));
        }
        let lease = self.session.lease();
        let k = &self.keys;
        let my_waiter = k.waiter(self.mode, lease).into_bytes();
        // The session's own keys on the lock first: at most one acquire of a session
        // holds or waits for a lock at a time (see `AcquireAttempt`).
        if let Some(h) = view.holds.iter().find(|h| h.lease == lease.get()) {
            return match self.own_hold(h).await? {
                OwnHold::Ours { rewrite } => {
                    // This attempt's grant committed but its answer was lost (a retried
                    // Txn, or a retry of the acquire): adopt.
                    let rev = Revision::from_i64(h.create_rev)
                        .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?;
                    if !self.adopt(h, rewrite).await? {
                        return Ok(Step::Next(self.read().await?));
                    }
                    self.finish(rev).await.map(Step::Granted)
                }
                OwnHold::Changed => Ok(Step::Next(self.read().await?)),
                OwnHold::Replaced => {
                    // The hold the caller named in `replaces`: its holder let it go, and
                    // its release may not have got through. Finish that release, so it
                    // neither blocks us nor gets its token handed out again.
                    let txn = Txn::new()
                        .when([Compare::create_revision(
                            h.key.clone(),
                            CompareOp::Equal,
                            h.create_rev,
                        )])
                        .and_then([
                            TxnOp::delete(h.key.clone(), None),
                            TxnOp::delete(k.grant_for_hold(&h.key), None),
                        ]);
                    if self.txn(txn).await?.succeeded() {
                        self.replaced_earlier
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok(Step::Next(self.read().await?))
                }
                OwnHold::Other { mode, attempt } => Err(Error::new(ErrorKind::AlreadyHeld {
                    mode,
                    grant_rev: Revision::from_i64(h.create_rev)
                        .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?,
                    attempt,
                })),
            };
        }
        if let Some(w) = view
            .queue
            .iter()
            .find(|w| w.lease == lease.get() && w.key != my_waiter)
        {
            // The session waits for the lock in the other mode: another attempt's, or
            // one of this handle's dropped ones, whose cleanup deletes it shortly.
            let attempt = self.attempt_of(&w.key).await?;
            if !self.abandoned.contains(&attempt) {
                return Err(Error::new(ErrorKind::AcquireInFlight {
                    attempt,
                    taken_over: false,
                }));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            return Ok(Step::Next(self.read().await?));
        }
        let put_rev = self
            .waiter_put_rev
            .load(std::sync::atomic::Ordering::SeqCst);
        let Some(mine) = view
            .queue
            .iter()
            .find(|w| w.key == my_waiter)
            .map(|w| (w.create_rev, w.mod_rev))
        else {
            // Our waiter key is gone (lease expired, or deleted by someone): enqueue again
            // at the back; a dead lease makes the put fail with SessionLost. Guarded by the
            // cancel marker like the first Txn, so a late copy cannot outlive a cleanup.
            // If a key appeared since the view (a retry of this attempt, or another
            // attempt), the put reads it instead, and it is decided on as in the first Txn.
            let (resp, inner) = self
                .guarded_txn(Txn::new().and_then([self.enqueue_op()]))
                .await?;
            let header_rev = resp.header().map_or(0, |h| h.revision());
            self.enqueued(header_rev, inner.op_responses().into_iter().next())
                .await?;
            return Ok(Step::Next(self.read().await?));
        };
        if mine.1 != put_rev {
            // Written since by another request: a retry of this attempt took its place
            // over (only a retry of the attempt writes a waiter key that exists). The
            // retry owns the key now; this request's cleanup compares its own value and
            // so leaves it alone.
            return Err(Error::new(ErrorKind::AcquireInFlight {
                attempt: self.id,
                taken_over: true,
            }));
        }
        let mine = mine.0;
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
            // Still this request's: not taken over by a retry of the attempt.
            Compare::mod_revision(
                my_waiter.clone(),
                CompareOp::Equal,
                self.waiter_put_rev
                    .load(std::sync::atomic::Ordering::SeqCst),
            ),
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
    pub(super) fn set_successor(&self, oldest: Option<&KeyValue>) {
        // Never this attempt's own waiter key, should it still be there.
        let oldest = oldest.filter(|kv| kv.lease() != self.session.lease().get());
        let s = Successor::from_oldest(&self.keys, oldest, self.epoch.get(), self.epoch_mod_rev);
        *self
            .successor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
    }

    /// Sends `ops` (reads) in one Txn and checks its answer against the epoch, like every
    /// read the waiter decides on.
    pub(super) async fn read_txn(&self, ops: impl Into<Vec<TxnOp>>) -> Result<TxnResponse> {
        let hw = self.locker.epoch.high_water();
        let resp = self.txn(Txn::new().and_then(ops.into())).await?;
        self.locker.epoch.check(resp.header(), hw, false)?;
        Ok(resp)
    }
}
