//! Rehome: moving one namespace to another tier.
//!
//! The protocol, driven by whoever calls [`Tiers::rehome`] (a replica of the service
//! answering `POST /v1/namespaces/{ns}/rehome`):
//!
//! 1. **Claim.** Create `tier/rehome/<ns>` on the home tier (a [`RehomeRecord`],
//!    phase `draining`) with a Txn that compares its absence: one rehome per namespace.
//! 2. **Fence the old tier** (`tier/fence/<ns>` there): its acquires of the namespace
//!    fail from now on ([`ErrorKind::NamespaceFenced`], the service's 503
//!    `namespace-moving`), before writing anything; so do its class edits, so that
//!    none is lost between the copy (step 4) and the switch.
//! 3. **Drain.** Wait until the old tier has no hold and no waiter key in the namespace
//!    on the lease it names (read at one revision after the fence), up to the drain
//!    deadline. Waiters queued
//!    before the fence may still be granted while it drains; a grant needs the waiter's
//!    key, so once none is left nothing more is granted there. Past the deadline the
//!    rehome is rolled back ([`ErrorKind::DrainTimeout`]): holds are not force-released
//!    (that stays the two-person force release).
//! 4. **Prepare the new tier.** Fence the namespace there too, then copy the
//!    namespace record (the directory's, with `cluster_tier` = new tier) and the old
//!    tier's classes.
//! 5. **Advance** the new tier's epoch above every tier's ([`Tiers::advance_epoch`],
//!    reason `rehome`): every token of the namespace after the move is above every
//!    token before it.
//! 6. **Switch** (the commit point): one Txn on the home tier, comparing the rehome
//!    record's revision, writes the namespace record naming the new tier and the
//!    record's phase `switched`.
//! 7. **Clean the new tier, then lift its fence**, then delete the rehome record. The
//!    clean deletes the namespace's keys there that no live session owns (holds,
//!    waiters and cancel markers not on the lease they name, quota slots on no lease:
//!    what `etcdctl make-mirror`, which copies keys without their leases, leaves), logs
//!    each at WARN and answers them in [`RehomeOutcome::removed`]. Left there, they
//!    would be stray keys that acquires meet (see `crate::stray`).
//!
//! Crash safety. Before the switch the namespace lives on the old tier; after it, on
//! the new one. The old tier is fenced before anything of the new tier is prepared, and
//! the new tier's fence is lifted only after the switch, so no two tiers grant in the
//! namespace at once, whatever fails. An error before the switch rolls back: delete the
//! rehome record (comparing its revision), then lift the old tier's fence. If the
//! rollback cannot finish (the home or old tier does not answer), the record stays and
//! the namespace is refused on both tiers until a rehome to the same tier is run again,
//! which resumes from step 2. A switch whose answer was lost is not rolled back (it may
//! have committed); the next run reads the record and resumes or finishes. A run after
//! the switch finishes step 7.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

use super::Tiers;
use crate::config_store::decode;
use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use crate::retry;
use crate::stray::ForeignKey;
use palisade_api::keys::LockEntry;
use palisade_api::{
    validate_name, EpochReason, EpochRecord, InvalidInput, RehomePhase, RehomeRecord,
};

/// How long a rehome waits for the old tier's holds and waiters unless told otherwise.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);

/// The longest drain a rehome accepts.
pub const MAX_DRAIN: Duration = Duration::from_secs(600);

/// How often the drain reads the old tier's lock keys of the namespace.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// A finished rehome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RehomeOutcome {
    /// The tier the namespace left (equal to `to` if it already lived there).
    pub from: String,
    /// The tier it lives on now.
    pub to: String,
    /// The epoch record `to` serves it under.
    pub epoch: EpochRecord,
    /// The namespace's keys on `to` that no live session owned, deleted before its fence
    /// was lifted (step 7), with the lease each was on (0: none).
    pub removed: Vec<ForeignKey>,
}

pub(super) async fn run(
    tiers: &Tiers,
    ns: &str,
    to: &str,
    drain: Duration,
) -> Result<RehomeOutcome> {
    validate_name(ns)?;
    tiers.locker(to)?;
    let drain = drain.min(MAX_DRAIN);
    let home = tiers.home();
    let key = home.keys().rehome(ns);
    let (record, mod_rev) = match read_record(home, &key).await? {
        Some((r, rev)) if r.to == to => (r, rev),
        Some((r, _)) => {
            return Err(Error::new(ErrorKind::RehomeInProgress {
                ns: ns.to_owned(),
                to: r.to,
            }))
        }
        None => {
            let (from, _) = tiers
                .namespace(ns)
                .await?
                .ok_or_else(|| Error::invalid(InvalidInput::UnknownNamespace(ns.to_owned())))?;
            if from == to {
                return Ok(RehomeOutcome {
                    from,
                    to: to.to_owned(),
                    epoch: tiers.locker(to)?.epoch().0,
                    removed: Vec::new(),
                });
            }
            let record = RehomeRecord {
                ns: ns.to_owned(),
                from,
                to: to.to_owned(),
                phase: RehomePhase::Draining,
                started_at_ms: now_ms(),
                epoch: None,
            };
            let rev = claim(home, &key, &record).await?;
            (record, rev)
        }
    };
    let from = tiers.locker(&record.from)?;
    let target = tiers.locker(to)?;
    let (record, mod_rev) = match record.phase {
        RehomePhase::Draining => {
            tracing::info!(ns, from = %record.from, to, "rehome: draining the old tier");
            match prepare(tiers, from, target, &record, drain).await {
                Ok(epoch) => switch(tiers, &key, mod_rev, record, epoch).await?,
                Err(e) => {
                    if let Err(rollback) = roll_back(home, &key, mod_rev, from, ns).await {
                        tracing::warn!(ns, error = %rollback,
                            "rehome failed and could not be rolled back: run it again to resume");
                    }
                    return Err(e);
                }
            }
        }
        RehomePhase::Switched => (record, mod_rev),
    };
    // Step 7: the namespace lives on `to` since the switch; clean it there (while
    // fenced, so no grant meets a stray key) and lift its fence.
    let removed = target.remove_strays(ns).await?;
    if !removed.is_empty() {
        tracing::warn!(
            ns,
            to,
            removed = removed.len(),
            "rehome: deleted keys of the namespace on the new tier that no live session owned"
        );
    }
    txn(
        target,
        Txn::new().and_then([TxnOp::delete(target.keys().ns_fence(ns), None)]),
    )
    .await?;
    txn(
        home,
        Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                mod_rev,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]),
    )
    .await?;
    tracing::info!(ns, from = %record.from, to, "rehome: done");
    Ok(RehomeOutcome {
        from: record.from,
        to: record.to,
        epoch: target.epoch().0,
        removed,
    })
}

/// Steps 2 to 5: fence and drain the old tier, prepare the new one, advance its epoch.
async fn prepare(
    tiers: &Tiers,
    from: &Locker,
    target: &Locker,
    record: &RehomeRecord,
    drain: Duration,
) -> Result<EpochRecord> {
    let ns = &record.ns;
    put(from, from.keys().ns_fence(ns)).await?;
    wait_drained(from, ns, Instant::now() + drain).await?;
    put(target, target.keys().ns_fence(ns)).await?;
    let mut namespace = tiers
        .home()
        .config()
        .namespace(ns)
        .await?
        .ok_or_else(|| Error::invalid(InvalidInput::UnknownNamespace(ns.clone())))?;
    namespace.cluster_tier = record.to.clone();
    target.config().put_namespace(&namespace).await?;
    for class in from.config().classes(ns).await? {
        target.config().copy_class(&class).await?;
    }
    tiers.advance_epoch(&record.to, EpochReason::Rehome).await
}

/// Step 6, the commit point: the home tier's namespace record names the new tier.
async fn switch(
    tiers: &Tiers,
    key: &str,
    mod_rev: i64,
    mut record: RehomeRecord,
    epoch: EpochRecord,
) -> Result<(RehomeRecord, i64)> {
    let home = tiers.home();
    let mut namespace = home
        .config()
        .namespace(&record.ns)
        .await?
        .ok_or_else(|| Error::invalid(InvalidInput::UnknownNamespace(record.ns.clone())))?;
    namespace.cluster_tier = record.to.clone();
    record.phase = RehomePhase::Switched;
    record.epoch = Some(epoch.epoch);
    let resp = txn(
        home,
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, mod_rev)])
            .and_then([
                TxnOp::put(home.keys().namespace(&record.ns), encode(&namespace)?, None),
                TxnOp::put(key, encode(&record)?, None),
            ]),
    )
    .await?;
    if !resp.succeeded() {
        // Another caller rolled it back or finished it meanwhile.
        return Err(Error::new(ErrorKind::RehomeInProgress {
            ns: record.ns,
            to: record.to,
        }));
    }
    let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
    tracing::info!(ns = %record.ns, to = %record.to, epoch = epoch.epoch.get(), "rehome: switched");
    Ok((record, rev))
}

/// Undoes a rehome that did not switch: deletes the record (if it is still this one),
/// then lifts the old tier's fence.
async fn roll_back(home: &Locker, key: &str, mod_rev: i64, from: &Locker, ns: &str) -> Result<()> {
    let resp = txn(
        home,
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, mod_rev)])
            .and_then([TxnOp::delete(key, None)]),
    )
    .await?;
    if resp.succeeded() {
        txn(
            from,
            Txn::new().and_then([TxnOp::delete(from.keys().ns_fence(ns), None)]),
        )
        .await?;
        tracing::info!(ns, "rehome rolled back: the namespace stays on its tier");
    }
    Ok(())
}

/// Step 3: until the old tier has no hold and no waiter key of the namespace.
async fn wait_drained(from: &Locker, ns: &str, deadline: Instant) -> Result<()> {
    let prefix = from.keys().namespace_locks(ns);
    loop {
        let resp = call_get(from, &prefix).await?;
        let (mut holds, mut waiters) = (0, 0);
        // Only keys on the lease they name are holds and waiters (a lease-less copy
        // never ends, and no grant needs it).
        for kv in resp.kvs() {
            match from.keys().parse_lock_entry(kv.key()).map(|e| e.entry) {
                Some(LockEntry::Hold(_, l)) if l.get() == kv.lease() => holds += 1,
                Some(LockEntry::Waiter(_, l)) if l.get() == kv.lease() => waiters += 1,
                _ => {}
            }
        }
        if holds + waiters == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::new(ErrorKind::DrainTimeout {
                ns: ns.to_owned(),
                holds,
                waiters,
            }));
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn read_record(home: &Locker, key: &str) -> Result<Option<(RehomeRecord, i64)>> {
    let resp = retry::call("rehome.get", deadline(home), home.request_timeout(), || {
        let (mut c, key) = (home.client().clone(), key.to_owned());
        async move { c.get(key, None).await }
    })
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
    resp.kvs()
        .first()
        .map(|kv| Ok((decode(kv.value())?, kv.mod_revision())))
        .transpose()
}

/// Step 1: creates the record; answers its revision.
async fn claim(home: &Locker, key: &str, record: &RehomeRecord) -> Result<i64> {
    let resp = txn(
        home,
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, encode(record)?, None)]),
    )
    .await?;
    if !resp.succeeded() {
        let to = read_record(home, key)
            .await?
            .map_or_else(|| record.to.clone(), |(r, _)| r.to);
        return Err(Error::new(ErrorKind::RehomeInProgress {
            ns: record.ns.clone(),
            to,
        }));
    }
    Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
}

async fn call_get(locker: &Locker, prefix: &str) -> Result<etcd_client::GetResponse> {
    retry::call(
        "rehome.drain",
        deadline(locker),
        locker.request_timeout(),
        || {
            let (mut c, prefix) = (locker.client().clone(), prefix.to_owned());
            async move {
                c.get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
            }
        },
    )
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))
}

async fn put(locker: &Locker, key: String) -> Result<()> {
    txn(
        locker,
        Txn::new().and_then([TxnOp::put(key, Vec::new(), None)]),
    )
    .await?;
    Ok(())
}

async fn txn(locker: &Locker, txn: Txn) -> Result<etcd_client::TxnResponse> {
    retry::call(
        "rehome.txn",
        deadline(locker),
        locker.request_timeout(),
        || {
            let (mut c, txn) = (locker.client().clone(), txn.clone());
            async move { c.txn(txn).await }
        },
    )
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))
}

fn deadline(locker: &Locker) -> Instant {
    Instant::now() + locker.request_timeout() * 3
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
