//! `held_lease_quota`: numbered slots in etcd, one per session opened with the namespace
//! and one per hold or wait of the namespace. The service takes them; the core owns the
//! etcd side.
//!
//! A namespace with quota `n` has slots `quota/<ns>/slot/<i>` for `i` below `n` (see
//! `RootKeys::quota_slot`), each put on its session's lease with a value naming its
//! taker and the take. Only slots on a lease count (`palisade_api::keys::is_live_slot`):
//! a slot with no lease, such as a copy `etcdctl make-mirror` made, is free, and a take
//! overwrites it. A slot is taken by a put that compares, in the same Txn, that the
//! slot is on no lease (missing, or lease-less: etcd compares a missing key's lease as
//! 0) and that no slot numbered `n` or above is on one (one range compare: a quota
//! lowered below the slots taken admits nobody until enough are freed). So at most `n`
//! slots are taken, across every replica, by construction: two takes of one slot cannot
//! both commit, and takes of different slots do not conflict, so a namespace's acquires
//! do not serialize on its quota.
//!
//! - A hold's or wait's slot is taken in the acquire's first Txn (the one that grants or
//!   enqueues), with a compare that the session's record is the one the caller read (its
//!   create revision): no separate quota call, and a cached session record can never
//!   act for a session that is gone or replaced. The slot is picked at random among
//!   those below `n`; a take that finds it taken reads the namespace's slots (the Txn's
//!   else branch, same round trip) and picks among the free ones, or answers
//!   [`ErrorKind::QuotaExceeded`] when `n` are taken.
//! - It is deleted in the Txn that deletes what a failed or dropped acquire wrote, in the
//!   Txn that releases or force-releases the hold (never by a release that found no such
//!   hold), or, with the lease, when the session is closed or expires. Every delete
//!   compares the slot's value, which is unique per take: an acquire tried again (its
//!   epoch advanced under it) takes a slot anew, since the failed attempt's cleanup may
//!   reach etcd after the retry's Txn.
//! - A session's slot is taken on its own Txn when the session is opened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::time::Instant;
use tracing::Instrument;

use palisade_api::keys::{is_live_slot, prefix_end, RootKeys};
use palisade_api::{HolderMeta, LeaseId, Mode};
use palisade_fence::Revision;

use crate::acquire::{AcquireAttempt, TxnGuard};
use crate::detached::SessionRecord;
use crate::error::{Error, ErrorKind, Result};
use crate::hold::Hold;
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry::{self, CallError};
use crate::session_cache::SlotRef;

/// The wait's own deadline ran out before etcd was seen failing: deadline exceeded;
/// else etcd did not answer the check: quorum lost.
fn upstream(e: CallError) -> Error {
    if !matches!(e, CallError::NoTime | CallError::Cut) {
        tracing::error!(error = ?e, "quota slot: etcd error");
    }
    e.into_caller_error(ErrorKind::QuorumLost)
}

/// A taken `held_lease_quota` slot of a session; deleted on drop (on a spawned task)
/// unless [`QuotaSlot::keep`] was called.
#[derive(Debug)]
#[must_use = "a slot dropped is freed at once"]
pub struct QuotaSlot {
    locker: Locker,
    slot: Option<SlotRef>,
}

impl QuotaSlot {
    /// The slot stays until the session's end.
    pub fn keep(mut self) {
        self.slot = None;
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let locker = self.locker.clone();
            // In the request's span, so the delete's etcd span is traced under it.
            tokio::spawn(
                async move { free(&locker, slot).await }.instrument(tracing::Span::current()),
            );
        }
    }
}

/// A Txn op that deletes `slot` if it still holds its take's value.
pub(crate) fn free_op(slot: &SlotRef) -> TxnOp {
    TxnOp::txn(
        Txn::new()
            .when([Compare::value(
                slot.key.as_str(),
                CompareOp::Equal,
                slot.value.as_str(),
            )])
            .and_then([TxnOp::delete(slot.key.as_str(), None)]),
    )
}

/// Deletes a slot if it still holds its take's value, retrying transient failures (such
/// as a dead member) for a few request timeouts.
async fn free(locker: &Locker, slot: SlotRef) {
    let per_request = locker.inner.request_timeout;
    let txn = Txn::new().and_then([free_op(&slot)]);
    let deleted = retry::call(
        "quota.free",
        Instant::now() + per_request * 3,
        per_request,
        || {
            let (mut c, txn) = (locker.client().clone(), txn.clone());
            async move { c.txn(txn).await }
        },
    )
    .await;
    if let Err(e) = deleted {
        tracing::warn!(error = ?e, "quota slot not deleted; it goes with its session");
    }
}

/// A random number below `n` (`n` > 0): splitmix64 over a counter seeded by the clock.
fn random_below(n: u32) -> u32 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos(),
    );
    let mut z = STATE
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(seed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(n)) as u32
}

/// One take of a slot of `ns` for `taker` (a `RootKeys::quota_taker`).
struct Take<'a> {
    keys: &'a RootKeys,
    ns: &'a str,
    quota: u32,
    lease: LeaseId,
    taker: String,
}

impl Take<'_> {
    fn exceeded(&self) -> Error {
        Error::new(ErrorKind::QuotaExceeded {
            ns: self.ns.to_owned(),
            quota: self.quota,
        })
    }

    /// Slot `i`, with a value unique to this take.
    fn slot(&self, i: u32) -> SlotRef {
        SlotRef {
            key: self.keys.quota_slot(self.ns, i),
            value: format!("{}#{:016x}", self.taker, random_below(u32::MAX)),
        }
    }

    /// The compares, put and read of taking `slot` (the read, of the namespace's slots,
    /// answers a failed take; with their values if `values`).
    fn ops(&self, slot: &SlotRef, values: bool) -> (Vec<Compare>, TxnOp, TxnOp) {
        let slots = self.keys.quota_slots(self.ns);
        // On no lease: missing, or a lease-less copy that never ends by itself.
        let when = vec![
            Compare::lease(slot.key.as_str(), CompareOp::Equal, 0),
            Compare::lease(
                self.keys.quota_slot(self.ns, self.quota),
                CompareOp::Equal,
                0,
            )
            .with_range(prefix_end(&slots)),
        ];
        let put = TxnOp::put(
            slot.key.as_str(),
            slot.value.as_str(),
            Some(PutOptions::new().with_lease(self.lease.get())),
        );
        let read = GetOptions::new().with_prefix();
        let read = TxnOp::get(
            slots,
            Some(if values { read } else { read.with_keys_only() }),
        );
        (when, put, read)
    }

    /// After a failed take: another slot below the quota that the read `kvs` (the
    /// namespace's slots) found free, or [`ErrorKind::QuotaExceeded`].
    fn next_slot(&self, kvs: &[KeyValue]) -> Result<SlotRef> {
        let slots = self.keys.quota_slots(self.ns);
        let taken: std::collections::HashSet<u32> = kvs
            .iter()
            .filter(|kv| is_live_slot(kv.lease()))
            .filter_map(|kv| {
                let rest = kv.key().strip_prefix(slots.as_bytes())?;
                std::str::from_utf8(rest).ok()?.parse().ok()
            })
            .collect();
        if taken.len() >= self.quota as usize {
            return Err(self.exceeded());
        }
        let start = random_below(self.quota);
        let free = (0..self.quota)
            .map(|d| ((u64::from(start) + u64::from(d)) % u64::from(self.quota)) as u32)
            .find(|i| !taken.contains(i))
            .ok_or_else(|| self.exceeded())?;
        Ok(self.slot(free))
    }
}

/// The kvs of a `Get` response, or an etcd error for anything else.
fn got(r: Option<&TxnOpResponse>) -> Result<&[KeyValue]> {
    match r {
        Some(TxnOpResponse::Get(g)) => Ok(g.kvs()),
        _ => Err(Error::new(ErrorKind::Etcd)),
    }
}

impl Locker {
    /// Acquires `name` for the session of `record` as
    /// [`acquire_with_meta`](Locker::acquire_with_meta) does, taking one of the
    /// namespace's `quota` slots in the acquire's first Txn (see the module docs), which
    /// also compares that the session's record is still the one `record` was read from
    /// (its `opened_rev`). The slot stays with the hold (freed by its release) and is
    /// freed if the acquire fails.
    ///
    /// # Errors
    ///
    /// As [`acquire_with_meta`](Locker::acquire_with_meta);
    /// [`ErrorKind::QuotaExceeded`] when the namespace has `quota` slots taken;
    /// [`ErrorKind::SessionLost`] when the session's record is gone or is another one
    /// (this locker's cache of it is dropped: read it again).
    pub async fn acquire_in_quota(
        &self,
        record: &SessionRecord,
        name: &LockName,
        mode: Mode,
        deadline: Instant,
        holder_meta: Option<&HolderMeta>,
        quota: u32,
    ) -> Result<Hold> {
        self.acquire_attempt_in_quota(
            record,
            name,
            mode,
            deadline,
            holder_meta,
            AcquireAttempt::default(),
            quota,
        )
        .await
    }

    /// [`acquire_in_quota`](Locker::acquire_in_quota) as `attempt` (see
    /// [`AcquireAttempt`]: a retry of an acquire, or one that replaces an earlier hold).
    /// When the namespace's slots are all taken and the session already has a slot for
    /// this lock (its hold, or its wait, under this attempt or another), the acquire
    /// uses that slot rather than answer [`ErrorKind::QuotaExceeded`]: a retry or a
    /// replace takes no more of the namespace than the acquire it follows, and another
    /// attempt is answered [`ErrorKind::AlreadyHeld`] or
    /// [`ErrorKind::AcquireInFlight`].
    ///
    /// # Errors
    ///
    /// As [`acquire_in_quota`](Locker::acquire_in_quota).
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_attempt_in_quota(
        &self,
        record: &SessionRecord,
        name: &LockName,
        mode: Mode,
        deadline: Instant,
        holder_meta: Option<&HolderMeta>,
        attempt: AcquireAttempt,
        quota: u32,
    ) -> Result<Hold> {
        let take = Take {
            keys: &self.inner.keys,
            ns: &name.ns,
            quota,
            lease: record.lease,
            taker: RootKeys::quota_taker(record.lease, Some((mode, &name.class, &name.key))),
        };
        if quota == 0 {
            return Err(take.exceeded());
        }
        let session_key = self.inner.keys.session(record.lease);
        let mut slot = take.slot(random_below(quota));
        // A slot of this lock's taker that the acquire uses rather than take one (the
        // quota is full): compared, neither written nor freed by it.
        let mut shared: Option<SlotRef> = None;
        // Every failed take reads the slots at a newer revision and picks a free one, so
        // a run of failures means others keep taking slots: bounded by time, not count.
        let until = deadline.max(Instant::now() + self.inner.request_timeout * 3);
        let mut stale = 0;
        loop {
            let (mut when, put, read) = take.ops(&slot, false);
            let (put, cleanup) = match &shared {
                None => (vec![put], vec![free_op(&slot)]),
                Some(kept) => {
                    when = vec![Compare::value(
                        kept.key.as_str(),
                        CompareOp::Equal,
                        kept.value.as_str(),
                    )];
                    (Vec::new(), Vec::new())
                }
            };
            when.push(Compare::create_revision(
                session_key.as_str(),
                CompareOp::Equal,
                record.opened_rev.as_i64(),
            ));
            let guard = Arc::new(TxnGuard {
                when,
                then: put,
                or_else: vec![
                    read,
                    TxnOp::get(
                        session_key.as_str(),
                        Some(GetOptions::new().with_keys_only()),
                    ),
                ],
                cleanup,
                failed: Mutex::new(None),
            });
            let attached = self.attach_session(record);
            let result = self
                .acquire_guarded(
                    &attached,
                    name,
                    mode,
                    deadline,
                    holder_meta,
                    attempt,
                    Some(guard.clone()),
                )
                .await;
            let Some(failed) = guard.take_failed() else {
                if let Err(e) = &result {
                    if self.retry_after_advance(e, &mut stale, deadline) {
                        // Another take (a new value): the failed attempt's cleanup,
                        // which may reach etcd later, deletes only its own.
                        slot = take.slot(random_below(quota));
                        continue;
                    }
                }
                if let Ok(hold) = &result {
                    let cached = self.inner.sessions.keep_slot(
                        record.lease,
                        take.taker.clone(),
                        slot.clone(),
                    );
                    if hold.replaced_earlier || cached.is_some_and(|old| old != slot) {
                        // The acquire ended an earlier hold of this session on the lock
                        // (a retry after a lost answer, say): its slot goes with it.
                        self.free_earlier_slots(&name.ns, record.lease, &take.taker, &slot)
                            .await;
                    }
                } else if result.as_ref().is_err_and(Error::is_session_lost) {
                    self.inner.sessions.forget(record.lease);
                }
                return result;
            };
            let session = got(failed.get(1))?;
            if session.first().map(KeyValue::create_revision) != Some(record.opened_rev.as_i64()) {
                self.inner.sessions.forget(record.lease);
                return Err(Error::new(ErrorKind::SessionLost));
            }
            match take.next_slot(got(failed.first())?) {
                Ok(next) => {
                    slot = next;
                    shared = None;
                }
                Err(full) if full.is_quota_exceeded() => {
                    match self
                        .slots_of(&name.ns, record.lease, &take.taker)
                        .await?
                        .pop()
                    {
                        Some(kept) => {
                            slot = kept.clone();
                            shared = Some(kept);
                        }
                        None => return Err(full),
                    }
                }
                Err(e) => return Err(e),
            }
            if Instant::now() >= until {
                // The slots kept changing until the deadline: etcd did not let it commit.
                return Err(Error::new(ErrorKind::QuorumLost));
            }
        }
    }

    /// Takes a slot of namespace `ns` for the session of `lease` (it lives as long as
    /// the session's lease), if fewer than `quota` slots of `ns` are taken.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuotaExceeded`] when the namespace has `quota` slots;
    /// [`ErrorKind::QuorumLost`] if etcd does not answer or the slots keep changing
    /// until `deadline`; [`ErrorKind::DeadlineExceeded`] if `deadline` cut a call short.
    pub async fn take_session_quota_slot(
        &self,
        ns: &str,
        lease: LeaseId,
        quota: u32,
        deadline: Instant,
    ) -> Result<QuotaSlot> {
        let take = Take {
            keys: &self.inner.keys,
            ns,
            quota,
            lease,
            taker: RootKeys::quota_taker(lease, None),
        };
        if quota == 0 {
            return Err(take.exceeded());
        }
        let per_request = self.inner.request_timeout;
        let mut slot = take.slot(random_below(quota));
        loop {
            let (when, put, read) = take.ops(&slot, true);
            let txn = Txn::new().when(when).and_then([put]).or_else([read]);
            // Safe to repeat: a repeat after a lost answer finds the slot taken (by this
            // take: its value) and takes another; the first is freed below.
            let done = retry::call("quota.take", deadline, per_request, || {
                let (mut c, txn) = (self.client().clone(), txn.clone());
                async move { c.txn(txn).await }
            })
            .await
            .map_err(upstream)?;
            if done.succeeded() {
                return Ok(QuotaSlot {
                    locker: self.clone(),
                    slot: Some(slot),
                });
            }
            let responses = done.op_responses();
            let kvs = got(responses.first())?;
            if kvs.iter().any(|kv| kv.value() == slot.value.as_bytes()) {
                // An earlier copy of this Txn committed.
                return Ok(QuotaSlot {
                    locker: self.clone(),
                    slot: Some(slot),
                });
            }
            slot = take.next_slot(kvs)?;
            if Instant::now() >= deadline {
                return Err(Error::new(ErrorKind::QuorumLost));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The slot of the hold or wait of `lease` on `lock` in `mode`: remembered by this
    /// locker if it took it, else read from the namespace's slots (one Range), else
    /// `None`.
    pub(crate) async fn quota_slot_of(
        &self,
        lock: &LockName,
        lease: LeaseId,
        mode: Mode,
    ) -> Result<Option<SlotRef>> {
        let taker = RootKeys::quota_taker(lease, Some((mode, &lock.class, &lock.key)));
        if let Some(slot) = self.inner.sessions.take_slot(lease, &taker) {
            return Ok(Some(slot));
        }
        Ok(self
            .slots_of(&lock.ns, lease, &taker)
            .await?
            .into_iter()
            .next())
    }

    /// The slots of namespace `ns` that `taker` of `lease` took, read in one Range.
    async fn slots_of(&self, ns: &str, lease: LeaseId, taker: &str) -> Result<Vec<SlotRef>> {
        let inner = &self.inner;
        let prefix = inner.keys.quota_slots(ns);
        let resp = retry::call(
            "quota.find",
            Instant::now() + inner.request_timeout * 3,
            inner.request_timeout,
            || {
                let (mut c, prefix) = (inner.client.clone(), prefix.clone());
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        let mine = format!("{taker}#");
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| kv.lease() == lease.get() && kv.value().starts_with(mine.as_bytes()))
            .filter_map(|kv| {
                Some(SlotRef {
                    key: kv.key_str().ok()?.to_owned(),
                    value: kv.value_str().ok()?.to_owned(),
                })
            })
            .collect())
    }

    /// Frees every slot of `taker` (a session's hold or wait on one lock) but `kept`: what
    /// is left of an earlier hold of the session on that lock, which the acquire that took
    /// `kept` ended. One Range of the namespace's slots and one Txn; a failure is logged,
    /// and such a slot then goes with its session.
    async fn free_earlier_slots(&self, ns: &str, lease: LeaseId, taker: &str, kept: &SlotRef) {
        let ops: Vec<TxnOp> = match self.slots_of(ns, lease, taker).await {
            Ok(slots) => slots.iter().filter(|s| *s != kept).map(free_op).collect(),
            Err(e) => {
                tracing::warn!(error = ?e, "earlier quota slots not read; they go with their session");
                return;
            }
        };
        if ops.is_empty() {
            return;
        }
        let per_request = self.inner.request_timeout;
        let txn = Txn::new().and_then(ops);
        let freed = retry::call(
            "quota.free",
            Instant::now() + per_request * 3,
            per_request,
            || {
                let (mut c, txn) = (self.inner.client.clone(), txn.clone());
                async move { c.txn(txn).await }
            },
        )
        .await;
        if let Err(e) = freed {
            tracing::warn!(error = ?e, "earlier quota slots not deleted; they go with their session");
        }
    }

    /// Puts back a slot [`Locker::quota_slot_of`] handed out, when it was not freed.
    pub(crate) fn keep_quota_slot(
        &self,
        lock: &LockName,
        lease: LeaseId,
        mode: Mode,
        slot: SlotRef,
    ) {
        let taker = RootKeys::quota_taker(lease, Some((mode, &lock.class, &lock.key)));
        let _ = self.inner.sessions.keep_slot(lease, taker, slot);
    }
}
/// Puts that take one of at most `limit` keys under `prefix`, atomically across every
/// locker: count the keys under `prefix` at revision R; if fewer than `limit`, commit
/// `ops` (which put one more key there) in a Txn whose compare requires every key under
/// `prefix` to have been created at or before R. A key created by anyone since R fails
/// the compare and the count is redone; keys deleted since R only lower the true count.
/// So the number of keys never exceeds `limit`.
pub(crate) struct CountedPut<'a> {
    /// The `op` of its etcd calls' spans: the count's, then the Txn's.
    pub(crate) spans: [&'static str; 2],
    pub(crate) prefix: &'a str,
    pub(crate) limit: u32,
    pub(crate) ops: Vec<TxnOp>,
    pub(crate) deadline: Instant,
}

impl CountedPut<'_> {
    /// The revision of the Txn that committed `ops`, or `None` when `limit` keys exist.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuorumLost`] if etcd does not answer or the count keeps changing
    /// until the deadline; [`ErrorKind::DeadlineExceeded`] if the deadline cut a call
    /// short before etcd was seen failing.
    pub(crate) async fn commit(self, locker: &Locker) -> Result<Option<Revision>> {
        let end = prefix_end(self.prefix);
        let [count_op, take_op] = self.spans;
        // Every etcd call goes through the shared retry, which moves a request off a dead
        // member (etcd-client keeps sending some requests to it) until the deadline.
        let per_request = locker.inner.request_timeout;
        let mut attempt = 0u32;
        loop {
            let resp = retry::call(count_op, self.deadline, per_request, || {
                let (mut c, end) = (locker.client().clone(), end.clone());
                let prefix = self.prefix.to_owned();
                async move {
                    c.get(
                        prefix,
                        Some(GetOptions::new().with_range(end).with_count_only()),
                    )
                    .await
                }
            })
            .await
            .map_err(upstream)?;
            if resp.count() >= i64::from(self.limit) {
                return Ok(None);
            }
            let rev = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            let txn = Txn::new()
                .when([
                    Compare::create_revision(self.prefix, CompareOp::Less, rev + 1)
                        .with_range(end.clone()),
                ])
                .and_then(self.ops.clone());
            // Safe to repeat: the puts are of this caller's own keys, and a repeat after
            // a lost answer fails the compare (the key is newer than R) and recounts.
            let done = retry::call(take_op, self.deadline, per_request, || {
                let (mut c, txn) = (locker.client().clone(), txn.clone());
                async move { c.txn(txn).await }
            })
            .await
            .map_err(upstream)?;
            if done.succeeded() {
                let rev = done
                    .header()
                    .map_or(0, etcd_client::ResponseHeader::revision);
                return Ok(Some(Revision::from_i64(rev).unwrap_or_default()));
            }
            if Instant::now() >= self.deadline {
                // The count kept changing until the deadline: etcd did not let it commit.
                return Err(Error::new(ErrorKind::QuorumLost));
            }
            // Someone else took a key since the count: back off a little, with jitter.
            attempt = attempt.saturating_add(1);
            let jitter = u64::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos(),
            ) % 7;
            tokio::time::sleep(Duration::from_millis(
                1 + jitter + u64::from(attempt.min(20)),
            ))
            .await;
        }
    }
}
