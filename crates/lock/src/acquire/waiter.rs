//! The waiter loop: read the lock at one revision; adopt, clean up, wait on the one key
//! that blocks this waiter, or grant in one Txn.

use std::collections::{HashMap, HashSet};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use palisade_fence::{FencingToken, Revision};
use tokio::time::Instant;

use super::Attempt;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Mode;
use crate::retry;

/// One parsed key of the lock's queue, holds or grant records.
struct Entry {
    key: Vec<u8>,
    create_rev: i64,
    mod_rev: i64,
    lease: i64,
    /// The `attempt` of the holder meta, if the value has one.
    attempt: Option<u64>,
}

impl From<&KeyValue> for Entry {
    fn from(kv: &KeyValue) -> Self {
        let attempt = serde_json::from_slice::<serde_json::Value>(kv.value())
            .ok()
            .and_then(|v| v.get("attempt").and_then(serde_json::Value::as_u64));
        Entry {
            key: kv.key().to_vec(),
            create_rev: kv.create_revision(),
            mod_rev: kv.mod_revision(),
            lease: kv.lease(),
            attempt,
        }
    }
}

/// The lock's state read at one revision.
struct View {
    revision: i64,
    queue: Vec<Entry>,
    holds: Vec<Entry>,
    grants: Vec<Entry>,
    epoch_mod_rev: i64,
}

pub(super) enum Step {
    /// Granted (or adopted); `None` never happens here (unprotected grants are made by
    /// the caller).
    Granted(Option<(Revision, FencingToken)>),
    /// Waited for a blocker, slept for lock-delay, or repaired the queue: read again.
    Waited,
    /// The grant Txn's compares failed: read again.
    Raced,
}

impl Attempt {
    async fn read(&self) -> Result<View> {
        let k = &self.keys;
        let prefix = |p: String| TxnOp::get(p, Some(GetOptions::new().with_prefix()));
        let hw = self.locker.epoch.high_water();
        let resp = self
            .txn(Txn::new().and_then([
                prefix(k.queue()),
                prefix(k.holds()),
                prefix(k.grants()),
                TxnOp::get(self.locker.keys.epoch(), None),
            ]))
            .await?;
        self.locker.epoch.check(resp.header(), hw, false)?;
        // Only keys inside the bounded lease-key ranges count, as in the compares; a
        // stray key elsewhere under `q/`, `h/` or `g/` is ignored.
        let mut gets = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g
                .kvs()
                .iter()
                .filter(|kv| {
                    k.in_lease_ranges(kv.key()) || kv.key() == self.locker.keys.epoch().as_bytes()
                })
                .map(Entry::from)
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        });
        let (queue, holds, grants, epoch) = (
            gets.next().unwrap_or_default(),
            gets.next().unwrap_or_default(),
            gets.next().unwrap_or_default(),
            gets.next().unwrap_or_default(),
        );
        Ok(View {
            revision: resp.header().map(|h| h.revision()).unwrap_or(0),
            queue,
            holds,
            grants,
            epoch_mod_rev: epoch.first().map(|e| e.mod_rev).unwrap_or(0),
        })
    }

    /// One round of the waiter loop: read; adopt, wait, or try to grant.
    pub(super) async fn step(
        &self,
        first_seen: &mut HashMap<(Vec<u8>, i64), Instant>,
    ) -> Result<Step> {
        let view = self.read().await?;
        if view.epoch_mod_rev != self.epoch_mod_rev {
            // This locker advanced the epoch since the attempt began, or another locker
            // did and both records agree on the new epoch (adopted): the attempt is
            // stale, the locker is not. Otherwise this locker refuses grants.
            if view.epoch_mod_rev == self.locker.epoch.snapshot().etcd_mod_rev
                || crate::locker::adopt_advanced_epoch(&self.locker).await
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
            .find(|h| h.key == my_hold && h.attempt == Some(self.id))
        {
            // This attempt's grant committed but its answer was lost (a retried Txn): adopt.
            let rev = Revision::from_i64(h.create_rev)
                .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?;
            let _ = self
                .txn(Txn::new().and_then([TxnOp::delete(my_waiter, None)]))
                .await;
            return self.finish(rev).await.map(Step::Granted);
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
            return Ok(Step::Waited);
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
            return Ok(Step::Waited);
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
        if let Some(b) = blocker {
            self.wait_deleted(&b.key, view.revision + 1).await?;
            return Ok(Step::Waited);
        }
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
                return Ok(Step::Waited);
            }
        }
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
        // No grant record created or changed since the read: the orphans seen are all.
        for (start, end) in ranges('g', relevant_modes) {
            when.push(
                Compare::mod_revision(start, CompareOp::Less, view.revision + 1).with_range(end),
            );
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
        let hw = self.locker.epoch.high_water();
        let resp = self.txn(Txn::new().when(when).and_then(ops)).await?;
        if !resp.succeeded() {
            return Ok(Step::Raced);
        }
        self.mint(&resp, hw, true).await.map(Step::Granted)
    }

    async fn sleep_until(&self, until: Instant) -> Result<()> {
        tokio::select! {
            _ = tokio::time::sleep_until(until.min(self.deadline)) => {
                if until > self.deadline { Err(Error::new(ErrorKind::DeadlineExceeded)) } else { Ok(()) }
            }
            _ = self.session.lost() => Err(Error::new(ErrorKind::SessionLost)),
        }
    }

    /// Waits until `key` is deleted at or after `from_rev` (a watch from the read's
    /// revision + 1, so a delete between the read and the watch is not missed). Any
    /// trouble with the watch (compaction, a cancelled stream) returns early: the
    /// caller re-reads.
    async fn wait_deleted(&self, key: &[u8], from_rev: i64) -> Result<()> {
        let opts = WatchOptions::new()
            .with_start_revision(from_rev)
            .with_filters([WatchFilterType::NoPut]);
        let watch = retry::call(
            "acquire.watch",
            self.deadline,
            self.locker.request_timeout,
            || {
                let (mut c, key, opts) = (self.locker.client.clone(), key.to_vec(), opts.clone());
                async move { c.watch(key, Some(opts)).await }
            },
        );
        let (_watcher, mut stream) = match watch.await {
            Ok(w) => w,
            Err(e) => return Err(e.into_error(ErrorKind::QuorumLost)),
        };
        loop {
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                            return Ok(());
                        }
                    }
                    _ => {
                        retry::Backoff::new().wait(self.deadline).await;
                        return Ok(());
                    }
                },
                _ = tokio::time::sleep_until(self.deadline) => return Err(Error::new(ErrorKind::DeadlineExceeded)),
                _ = self.session.lost() => return Err(Error::new(ErrorKind::SessionLost)),
            }
        }
    }
}
