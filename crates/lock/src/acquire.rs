//! Acquire: one Txn when uncontended; otherwise a FIFO waiter that watches only the key
//! that blocks it, and a grant Txn whose header revision is the token's revision.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchFilterType, WatchOptions,
};
use palisade_fence::{FencingToken, Revision};
use serde::Serialize;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::hold::Hold;
use crate::keys::{prefix_end, LockKeys};
use crate::locker::{LockName, LockerInner};
use crate::model::{LockClass, Mode, QuorumPolicy};
use crate::retry::{self, CallError};
use crate::session::Session;

/// The value of hold, waiter and grant-record keys: who, for which class, in which epoch.
/// The token of a hold is `epoch · 2^48 + create_revision` of its hold key.
#[derive(Debug, Serialize)]
struct HolderMeta<'a> {
    spiffe_id: &'a str,
    class: &'a str,
    mode: Mode,
    epoch: u16,
    /// Which acquire wrote it (unique within the process, and so within the lease): a
    /// hold of this lease from another attempt is a leftover, never adopted.
    attempt: u64,
}

/// Numbers acquire attempts.
static ATTEMPTS: AtomicU64 = AtomicU64::new(1);

/// Everything one acquire needs, and the cleanup if it does not end in a hold.
struct Attempt {
    id: u64,
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
    /// Whether dropping this attempt ends the session's claim on the lock (not when an
    /// unprotected [`Hold`] took it over).
    owns_busy: bool,
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
        let (locker, keys, mode, session, meta, owns_busy) = (
            self.locker.clone(),
            self.keys.clone(),
            self.mode,
            self.session.clone(),
            std::mem::take(&mut self.meta),
            self.owns_busy,
        );
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                if owns_busy {
                    session.unmark_busy(keys.base());
                }
                rt.spawn(async move {
                    let mut backoff = retry::Backoff::new();
                    while let Err(CallError::Unavailable(_)) =
                        cleanup(&locker, &keys, mode, &session, &meta).await
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

/// Deletes the waiter key, and the hold and grant record, that this attempt wrote, and
/// nothing else: each delete compares the key's value with this attempt's meta (unique
/// per attempt), so a later acquire of the same session is never touched. One Txn with
/// two nested Txns (etcd 3.3+).
async fn cleanup(
    locker: &LockerInner,
    keys: &LockKeys,
    mode: Mode,
    session: &Session,
    meta: &[u8],
) -> Result<(), CallError> {
    let lease = session.lease();
    let (waiter, hold) = (keys.waiter(mode, lease), keys.hold(mode, lease));
    let txn = Txn::new().and_then([
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
    let deadline = Instant::now() + locker.request_timeout * 3;
    retry::call(deadline, locker.request_timeout, || {
        let (mut c, txn) = (locker.client.clone(), txn.clone());
        async move { c.txn(txn).await }
    })
    .await
    .map(drop)
}

pub(crate) async fn acquire(
    locker: Arc<LockerInner>,
    session: &Session,
    name: &LockName,
    class: Arc<LockClass>,
    mode: Mode,
    deadline: Instant,
) -> Result<Hold> {
    if session.loss().is_some() {
        return Err(Error::new(ErrorKind::SessionLost));
    }
    let keys = locker.keys.lock(&name.ns, &name.class, &name.key);
    if !session.mark_busy(keys.base()) {
        return Err(Error::invalid(crate::error::InvalidInput::AlreadyAcquiring));
    }
    let epoch = locker.epoch.snapshot();
    let id = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
    let meta = serde_json::to_vec(&HolderMeta {
        spiffe_id: session.spiffe_id().as_str(),
        class: &class.id,
        mode,
        epoch: epoch.record.epoch.get(),
        attempt: id,
    })
    .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
    let mut attempt = Attempt {
        id,
        locker,
        session: session.clone(),
        keys,
        name: name.clone(),
        class,
        mode,
        deadline,
        meta,
        disarmed: false,
        owns_busy: true,
    };
    if let Some(m) = epoch.mismatch {
        attempt.disarmed = true;
        session.unmark_busy(attempt.keys.base());
        return Err(Error::epoch(m));
    }
    let result = attempt.run().await;
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
        Err(e) => {
            // Delete what we may have written before reporting, so a caller that looks
            // right after finds no waiter key.
            if cleanup(
                &attempt.locker,
                &attempt.keys,
                attempt.mode,
                &attempt.session,
                &attempt.meta,
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

enum Step {
    Granted(Option<(Revision, FencingToken)>),
    Continue,
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
            done: false,
        }
    }

    fn lease(&self) -> i64 {
        self.session.lease().get()
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        retry::call(self.deadline, self.locker.request_timeout, || {
            let (mut c, txn) = (self.locker.client.clone(), txn.clone());
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))
    }

    fn epoch_compare(&self) -> Compare {
        Compare::mod_revision(
            self.locker.keys.epoch(),
            CompareOp::Equal,
            self.locker.epoch.snapshot().etcd_mod_rev,
        )
    }

    fn grant_ops(&self) -> Vec<TxnOp> {
        let lease = self.session.lease();
        vec![
            TxnOp::put(
                self.keys.hold(self.mode, lease),
                self.meta.clone(),
                Some(PutOptions::new().with_lease(lease.get())),
            ),
            TxnOp::put(self.keys.grant(self.mode, lease), self.meta.clone(), None),
        ]
    }

    async fn run(&self) -> Result<Option<(Revision, FencingToken)>> {
        // Fast path, one Txn: no conflicting hold, no waiter, no unconsumed grant record
        // (an expired or forced hold whose lock-delay may apply) -> hold; else enqueue.
        let empty = |prefix: String| {
            Compare::create_revision(prefix.clone(), CompareOp::Equal, 0)
                .with_range(prefix_end(&prefix))
        };
        let k = &self.keys;
        let mut when = vec![self.epoch_compare()];
        match self.mode {
            Mode::Exclusive => when.extend([empty(k.holds()), empty(k.queue()), empty(k.grants())]),
            Mode::Shared => when.extend([
                Compare::create_revision(
                    k.hold(Mode::Shared, self.session.lease()),
                    CompareOp::Equal,
                    0,
                ),
                empty(k.holds_of(Mode::Exclusive)),
                empty(k.queue_of(Mode::Exclusive)),
                empty(k.grants_of(Mode::Exclusive)),
            ]),
        }
        let enqueue = TxnOp::put(
            k.waiter(self.mode, self.session.lease()),
            self.meta.clone(),
            Some(PutOptions::new().with_lease(self.lease())),
        );
        let hw = self.locker.epoch.high_water();
        let resp = self
            .txn(
                Txn::new()
                    .when(when)
                    .and_then(self.grant_ops())
                    .or_else([enqueue]),
            )
            .await?;
        if resp.succeeded() {
            return self.mint(&resp, hw, true).await;
        }
        self.locker.epoch.check(resp.header(), hw, false)?;
        let mut first_seen: HashMap<(Vec<u8>, i64), Instant> = HashMap::new();
        loop {
            if self.session.loss().is_some() {
                return Err(Error::new(ErrorKind::SessionLost));
            }
            match self.step(&mut first_seen).await? {
                Step::Granted(g) => return Ok(g),
                Step::Continue => {}
            }
        }
    }

    /// Checks a succeeded grant's header against the epoch, waits until its revision is
    /// durably recorded, and mints the token. A grant refused by the epoch check is
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
        self.locker.epoch.commit(grant_rev).await?;
        let epoch = self.locker.epoch.snapshot().record.epoch;
        let token = FencingToken::from_parts(epoch, grant_rev).map_err(|e| {
            Error::with_source(
                ErrorKind::EpochMismatch(crate::error::EpochMismatch::Advanced),
                e,
            )
        })?;
        Ok(Some((grant_rev, token)))
    }

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
        let mut gets = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().iter().map(Entry::from).collect::<Vec<_>>(),
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
    async fn step(&self, first_seen: &mut HashMap<(Vec<u8>, i64), Instant>) -> Result<Step> {
        let view = self.read().await?;
        if view.epoch_mod_rev != self.locker.epoch.snapshot().etcd_mod_rev {
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
            return Ok(Step::Continue);
        }
        let Some(mine) = view
            .queue
            .iter()
            .find(|w| w.key == my_waiter)
            .map(|w| w.create_rev)
        else {
            // Our waiter key is gone (lease expired, or deleted by someone): enqueue again
            // at the back; a dead lease makes the put fail with SessionLost.
            let put = TxnOp::put(
                my_waiter,
                self.meta.clone(),
                Some(PutOptions::new().with_lease(self.lease())),
            );
            self.txn(Txn::new().and_then([put])).await?;
            return Ok(Step::Continue);
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
            return Ok(Step::Continue);
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
                return Ok(Step::Continue);
            }
        }
        let range = |p: String| prefix_end(&p);
        let mut when = vec![
            Compare::create_revision(my_waiter.clone(), CompareOp::Equal, mine),
            self.epoch_compare(),
            // No grant record created or changed since the read: the orphans seen are all.
            Compare::mod_revision(relevant.clone(), CompareOp::Less, view.revision + 1)
                .with_range(range(relevant.clone())),
        ];
        match self.mode {
            Mode::Exclusive => when.extend([
                Compare::create_revision(k.holds(), CompareOp::Equal, 0)
                    .with_range(range(k.holds())),
                // Every waiter created at or after mine (mine is in the range, so it is
                // never empty).
                Compare::create_revision(k.queue(), CompareOp::Greater, mine - 1)
                    .with_range(range(k.queue())),
            ]),
            Mode::Shared => {
                let xq = k.queue_of(Mode::Exclusive);
                when.push(
                    Compare::create_revision(k.holds_of(Mode::Exclusive), CompareOp::Equal, 0)
                        .with_range(range(k.holds_of(Mode::Exclusive))),
                );
                // No leftover shared hold of this lease (a put would keep its old create
                // revision, and the token would not match the key).
                when.push(Compare::create_revision(
                    my_hold.clone(),
                    CompareOp::Equal,
                    0,
                ));
                // Every exclusive waiter after mine. An empty range compares as 0, so
                // "none at all" needs its own form.
                if view.queue.iter().any(|w| is_x_waiter(&w)) {
                    when.push(
                        Compare::create_revision(xq.clone(), CompareOp::Greater, mine)
                            .with_range(range(xq)),
                    );
                } else {
                    when.push(
                        Compare::create_revision(xq.clone(), CompareOp::Equal, 0)
                            .with_range(range(xq)),
                    );
                }
            }
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
            return Ok(Step::Continue);
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
        let watch = retry::call(self.deadline, self.locker.request_timeout, || {
            let (mut c, key, opts) = (self.locker.client.clone(), key.to_vec(), opts.clone());
            async move { c.watch(key, Some(opts)).await }
        });
        let (_watcher, mut stream) = match watch.await {
            Ok(w) => w,
            Err(CallError::Unavailable(_)) if Instant::now() >= self.deadline => {
                return Err(Error::new(ErrorKind::DeadlineExceeded))
            }
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
