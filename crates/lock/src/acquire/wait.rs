//! Waiting: the watch-driven wait on the one waiter or holder that blocks this waiter,
//! the lock-delay sleep, and the confirmation of a hand-over that ended a wait.

use etcd_client::{EventType, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, WatchResponse};
use palisade_fence::Revision;
use tokio::time::Instant;

use super::decide::{Entry, Step, View, Woken};
use super::Attempt;
use crate::error::{Error, ErrorKind, Result};
use crate::handover::oldest_waiter_options;
use crate::lock_watch::{LockSubscription, QUIET_TIMEOUTS};
use crate::retry;
use palisade_api::Mode;

impl Attempt {
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
    pub(super) async fn wait_released(&self, blocker: &Entry, view: &View) -> Result<Woken> {
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

    /// The release of the predecessor handed the lock to this waiter: its hold key was
    /// put at `rev` (seen by the lock's watch, or by a read of the wait's keys, both above the
    /// view this waiter waited on). Confirms it with a read checked against the epoch:
    /// the hold key is still this attempt's (create revision `rev`, this attempt's meta,
    /// this lease) and the epoch key is still at this attempt's mod revision, which the
    /// hand-over compared too; the same read finds whom this hold hands over to next.
    /// Anything else: read anew and decide on that (a hold of ours that is no longer as
    /// handed over, or an epoch that moved, is dealt with by the loop).
    pub(super) async fn adopt_handed_over(&self, rev: i64) -> Result<Step> {
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

    /// Sleeps until `until` (a lock-delay), or fails at the deadline or the session's loss.
    pub(super) async fn sleep_until(&self, until: Instant) -> Result<()> {
        tokio::select! {
            _ = tokio::time::sleep_until(until.min(self.deadline)) => {
                if until > self.deadline { Err(Error::new(ErrorKind::DeadlineExceeded)) } else { Ok(()) }
            }
            _ = self.session.lost() => Err(Error::new(ErrorKind::SessionLost)),
        }
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
