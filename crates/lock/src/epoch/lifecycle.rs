//! How a locker comes to grant under an epoch: start (bootstrap or load), adopt an
//! epoch another locker advanced, advance, and move etcd's revision past a reservation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use palisade_fence::{Epoch, Revision};
use tokio::time::Instant;

use super::record::EpochStore;
use super::restored::drop_waiters_up_to;
use super::state::{Current, EpochState};
use crate::config_store::decode;
use crate::error::{EpochMismatch, Error, ErrorKind, Result};
use crate::retry;
use palisade_api::keys::RootKeys;
use palisade_api::{EpochReason, EpochRecord};

/// Advance: starts a new epoch on the cluster `client` is connected to (see
/// [`Locker::advance_epoch`](crate::Locker::advance_epoch)). The new epoch is above
/// etcd's, the durable record's, this locker's and `floor` (the highest epoch of the
/// other tiers); the durable record is written first, then etcd's.
pub(crate) async fn advance(
    client: &Client,
    keys: &RootKeys,
    epoch: &EpochState,
    per_request: Duration,
    reason: EpochReason,
    floor: Epoch,
) -> Result<EpochRecord> {
    let deadline = Instant::now() + per_request * 3;
    let key = keys.epoch();
    let resp = retry::call("epoch.get", deadline, per_request, || {
        let (mut c, key) = (client.clone(), key.clone());
        async move { c.get(key, None).await }
    })
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
    let header = resp.header().ok_or_else(|| Error::new(ErrorKind::Etcd))?;
    let in_etcd: Option<EpochRecord> = resp
        .kvs()
        .first()
        .map(|kv| decode(kv.value()))
        .transpose()?;
    let durable = epoch
        .store()
        .load()
        .await
        .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
    let used = [
        in_etcd.as_ref().map(|r| r.epoch),
        durable.as_ref().map(|r| r.epoch),
        Some(epoch.snapshot().record.epoch),
        Some(floor),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(Epoch::ZERO);
    let next = used
        .next()
        .ok_or_else(|| Error::new(ErrorKind::EpochExhausted))?;
    let record = EpochRecord::new(
        next,
        header.cluster_id(),
        reason,
        Revision::from_i64(header.revision()).unwrap_or_default(),
    );
    epoch
        .store()
        .store(record.clone())
        .await
        .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
    let value =
        serde_json::to_vec(&record).map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
    let put = retry::call("epoch.put", deadline, per_request, || {
        let (mut c, key, value) = (client.clone(), key.clone(), value.clone());
        async move { c.put(key, value, None).await }
    })
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
    let mod_rev = put.header().map(|h| h.revision()).unwrap_or(0);
    epoch.replace(Current {
        record: record.clone(),
        etcd_mod_rev: mod_rev,
        mismatch: None,
    });
    if matches!(reason, EpochReason::Restore) {
        // The epoch has advanced whatever happens here; a failure leaves the waiters a
        // restore brought back in place (see `restored`), which the next advance drops.
        let deadline = Instant::now() + per_request * 3;
        match drop_waiters_up_to(client, keys, header.revision(), deadline, per_request).await {
            Ok(n) => tracing::info!(
                dropped = n,
                "epoch advanced: waiters the restore brought back dropped"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "epoch advanced, but the waiters the restore brought back could not be dropped")
            }
        }
    }
    Ok(record)
}

/// Called when the epoch key changed under this locker (another locker advanced it), and
/// by every acquire while this locker refuses grants: re-reads both records and adopts
/// the new epoch if they agree on an epoch above this locker's, naming the cluster that
/// answered, and etcd has not gone below the durable record's highest grant revision
/// (an operator-sanctioned advance). If etcd is below the record's reservation, it is
/// first moved past it (another locker may have handed out tokens up to it). Returns
/// whether it adopted; otherwise the caller refuses (sticky until adopted or advanced
/// here).
pub(crate) async fn adopt_advanced(
    client: &Client,
    keys: &RootKeys,
    epoch: &EpochState,
    per_request: Duration,
) -> bool {
    let deadline = Instant::now() + per_request * 3;
    let key = keys.epoch();
    let Ok(resp) = retry::call("epoch.get", deadline, per_request, || {
        let (mut c, key) = (client.clone(), key.clone());
        async move { c.get(key, None).await }
    })
    .await
    else {
        return false;
    };
    let Some(header) = resp.header() else {
        return false;
    };
    let Some(Ok((etcd, mod_rev))) = resp
        .kvs()
        .first()
        .map(|kv| decode::<EpochRecord>(kv.value()).map(|r| (r, kv.mod_revision())))
    else {
        return false;
    };
    let Ok(Some(durable)) = epoch.store().load().await else {
        return false;
    };
    let current = epoch.snapshot();
    let mut revision = Revision::from_i64(header.revision()).unwrap_or_default();
    let agreed = etcd.epoch == durable.epoch
        && etcd.cluster_id == durable.cluster_id
        && durable.cluster_id == header.cluster_id()
        && revision >= durable.highest_grant_rev;
    if !agreed {
        return false;
    }
    if durable.epoch <= current.record.epoch {
        // Nothing newer; a concurrent acquire may have adopted this very record.
        return current.mismatch.is_none() && current.etcd_mod_rev == mod_rev;
    }
    if revision < durable.reserved_rev {
        let deadline = bump_deadline(per_request, revision, durable.reserved_rev);
        match move_revision_to(
            client,
            keys.epoch_bump(),
            durable.reserved_rev.get(),
            deadline,
            per_request,
        )
        .await
        {
            Ok((reached, _)) => revision = Revision::new(reached),
            Err(_) => return false,
        }
    }
    let adopted = epoch.adopt(
        Current {
            record: durable.clone(),
            etcd_mod_rev: mod_rev,
            mismatch: None,
        },
        revision.get(),
    );
    if adopted {
        tracing::info!(
            epoch = durable.epoch.get(),
            "adopting an epoch advanced by another locker"
        );
    }
    adopted
}

/// How long moving etcd's revision from `from` to `to` may take: five request timeouts
/// plus 5 ms per write, about three times what one write takes a loaded etcd.
fn bump_deadline(per_request: Duration, from: Revision, to: Revision) -> Instant {
    let writes = to.get().saturating_sub(from.get());
    Instant::now() + per_request * 5 + Duration::from_millis(writes.saturating_mul(5))
}

/// Start: reads both epoch records and decides whether grants may proceed; if they may
/// and etcd's revision is below the durable reservation, moves it there first. Returns
/// the epoch and the highest etcd revision seen.
pub(crate) async fn start(
    client: &Client,
    keys: &RootKeys,
    store: &dyn EpochStore,
    per_request: Duration,
) -> Result<(Current, u64)> {
    let deadline = Instant::now() + per_request * 5;
    let key = keys.epoch();
    let resp = retry::call("epoch.load", deadline, per_request, || {
        let (mut c, key) = (client.clone(), key.clone());
        async move { c.get(key, None).await }
    })
    .await
    .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
    let header = resp.header().ok_or_else(|| Error::new(ErrorKind::Etcd))?;
    let (cluster_id, revision) = (
        header.cluster_id(),
        Revision::from_i64(header.revision()).unwrap_or_default(),
    );
    let in_etcd = match resp.kvs().first() {
        Some(kv) => Some((decode::<EpochRecord>(kv.value())?, kv.mod_revision())),
        None => None,
    };
    let durable = store
        .load()
        .await
        .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
    match (in_etcd, durable) {
        (None, None) => {
            let record =
                EpochRecord::new(Epoch::ZERO, cluster_id, EpochReason::Bootstrap, revision);
            store
                .store(record.clone())
                .await
                .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
            let value = serde_json::to_vec(&record)
                .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), value, None)]);
            let resp = retry::call("epoch.bootstrap", deadline, per_request, || {
                let (mut c, txn) = (client.clone(), txn.clone());
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
            let mismatch = (!resp.succeeded()).then_some(EpochMismatch::Records {
                etcd: None,
                durable: Some(Epoch::ZERO),
            });
            let mod_rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            Ok((
                Current {
                    record,
                    etcd_mod_rev: mod_rev,
                    mismatch,
                },
                mod_rev.max(0) as u64,
            ))
        }
        (Some((etcd, mod_rev)), Some(durable))
            if etcd.epoch == durable.epoch && etcd.cluster_id == durable.cluster_id =>
        {
            let mismatch = if cluster_id != durable.cluster_id {
                Some(EpochMismatch::ClusterId {
                    recorded: durable.cluster_id,
                    actual: cluster_id,
                })
            } else if revision < durable.highest_grant_rev {
                Some(EpochMismatch::RevisionBehind {
                    recorded: durable.highest_grant_rev,
                    actual: revision,
                })
            } else {
                None
            };
            let mut seen = revision;
            if mismatch.is_none() && revision < durable.reserved_rev {
                // Tokens up to the reservation may have been handed out (by a locker
                // that crashed, or by running lockers sharing the record) without being
                // confirmed: every grant of this locker must be above it.
                let deadline = bump_deadline(per_request, revision, durable.reserved_rev);
                let (reached, writes) = move_revision_to(
                    client,
                    keys.epoch_bump(),
                    durable.reserved_rev.get(),
                    deadline,
                    per_request,
                )
                .await?;
                tracing::info!(
                    from = revision.get(),
                    reservation = durable.reserved_rev.get(),
                    writes,
                    "moved etcd's revision past the epoch reservation"
                );
                seen = Revision::new(reached);
            }
            Ok((
                Current {
                    record: durable,
                    etcd_mod_rev: mod_rev,
                    mismatch,
                },
                seen.get(),
            ))
        }
        (etcd, durable) => {
            let mismatch = Some(EpochMismatch::Records {
                etcd: etcd.as_ref().map(|(r, _)| r.epoch),
                durable: durable.as_ref().map(|r| r.epoch),
            });
            let record = durable
                .or(etcd.as_ref().map(|(r, _)| r.clone()))
                .unwrap_or_else(|| {
                    EpochRecord::new(Epoch::ZERO, cluster_id, EpochReason::Bootstrap, revision)
                });
            Ok((
                Current {
                    record,
                    etcd_mod_rev: etcd.map(|(_, m)| m).unwrap_or(0),
                    mismatch,
                },
                revision.get(),
            ))
        }
    }
}

/// How many writes [`move_revision_to`] keeps in flight.
const BUMP_CONCURRENCY: usize = 16;

/// Writes to `key` (a key of Palisade's own, no lease) until etcd's revision is at least
/// `target`, keeping [`BUMP_CONCURRENCY`] writes in flight; returns the highest header
/// revision seen and the writes made. Each write is one revision.
///
/// # Errors
///
/// [`ErrorKind::QuorumLost`] if etcd cannot commit before `deadline`.
pub(crate) async fn move_revision_to(
    client: &Client,
    key: String,
    target: u64,
    deadline: Instant,
    per_request: Duration,
) -> Result<(u64, u64)> {
    let reached = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..BUMP_CONCURRENCY {
        let (client, key, reached, writes) =
            (client.clone(), key.clone(), reached.clone(), writes.clone());
        tasks.spawn(async move {
            while reached.load(Ordering::SeqCst) < target {
                let resp = retry::call("epoch.bump", deadline, per_request, || {
                    let (mut c, key) = (client.clone(), key.clone());
                    async move { c.put(key, Vec::new(), None).await }
                })
                .await
                .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
                writes.fetch_add(1, Ordering::SeqCst);
                let rev = resp
                    .header()
                    .map(|h| h.revision().max(0) as u64)
                    .unwrap_or(0);
                reached.fetch_max(rev, Ordering::SeqCst);
            }
            Ok::<(), Error>(())
        });
    }
    let mut outcome = Ok(());
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                outcome = outcome.and(Err(e));
                tasks.abort_all();
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                outcome = outcome.and(Err(Error::with_source(ErrorKind::Etcd, e)));
                tasks.abort_all();
            }
        }
    }
    outcome?;
    Ok((
        reached.load(Ordering::SeqCst),
        writes.load(Ordering::SeqCst),
    ))
}
