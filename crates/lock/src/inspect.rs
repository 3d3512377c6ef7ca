//! A read-only view of one lock: its holders and its queue, at one revision.

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use palisade_fence::{Epoch, FencingToken, Revision};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry;
use crate::stray::ForeignKey;
use palisade_api::keys::HoldValue;
use palisade_api::validate_key;
use palisade_api::{validate_name, LeaseId, Mode};

/// One holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's session lease.
    pub lease: LeaseId,
    /// How it holds the lock.
    pub mode: Mode,
    /// The revision of the granting Txn (the hold key's create revision).
    pub grant_rev: Revision,
    /// `epoch · 2^48 + grant_rev`, with the epoch recorded in the hold.
    pub token: FencingToken,
    /// The SPIFFE ID of the holder's session.
    pub spiffe_id: String,
    /// What the holder attached at acquire ([`Locker::acquire_with_meta`]), if anything.
    pub holder_meta: Option<Map<String, Value>>,
}

/// One waiter in a lock's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// The waiter's session lease.
    pub lease: LeaseId,
    /// The mode it waits for.
    pub mode: Mode,
    /// Its waiter key's create revision: its place in the FIFO queue.
    pub create_rev: Revision,
    /// The SPIFFE ID of the waiter's session.
    pub spiffe_id: String,
    /// What the waiter attached at acquire, if anything.
    pub holder_meta: Option<Map<String, Value>>,
}

/// A lock's holders and waiters, read at one etcd revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    /// The revision read at.
    pub revision: Revision,
    /// Holders, by grant revision.
    pub holders: Vec<Holder>,
    /// Waiters in queue order (create revision).
    pub waiters: Vec<Waiter>,
    /// Keys inside the lock's bounded `q/`, `h/`, `g/` lease-key ranges that are not
    /// holds, waiters or grant records of a live session, with the lease etcd keeps each
    /// on: a key of another shape, a hold or waiter whose value does not parse, or one
    /// not on the lease its name gives (no lease at all, say, as `etcdctl make-mirror`
    /// copies keys). None of them is a holder or a waiter; the next acquire of the lock
    /// deletes the `q/` and `h/` ones (see the crate's stray key rules), and this is how
    /// an operator sees them before. Stray keys outside those ranges are ignored
    /// everywhere and not listed.
    pub foreign_keys: Vec<ForeignKey>,
}

/// A stored hold or waiter value, as much as the state lists.
struct Meta {
    spiffe_id: String,
    mode: Mode,
    epoch: Epoch,
    holder_meta: Option<Map<String, Value>>,
}

impl Meta {
    fn parse(value: &[u8]) -> Option<Meta> {
        let v = HoldValue::parse(value)?;
        Some(Meta {
            spiffe_id: v.spiffe_id.into_owned(),
            mode: v.mode,
            epoch: Epoch::new(v.epoch).ok()?,
            holder_meta: v.holder_meta.map(|m| m.into_owned().into()),
        })
    }
}

impl Locker {
    /// Reads one lock's holders and waiters at one revision. Keys in the lock's bounded
    /// lease-key ranges that are not holds, waiters or grant records of a live session
    /// (not on the lease they name: no lease, say) are listed in
    /// [`LockState::foreign_keys`], never as holders or waiters.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] for a bad name or key; [`ErrorKind::QuorumLost`] if
    /// etcd does not answer.
    pub async fn lock_state(&self, lock: &LockName) -> Result<LockState> {
        validate_name(&lock.ns)?;
        validate_name(&lock.class)?;
        validate_key(&lock.key)?;
        let inner = &self.inner;
        let keys = inner.keys.lock(&lock.ns, &lock.class, &lock.key);
        let prefix = |p: String| TxnOp::get(p, Some(GetOptions::new().with_prefix()));
        let txn = Txn::new().and_then([
            prefix(keys.holds()),
            prefix(keys.queue()),
            prefix(keys.grants()),
        ]);
        let deadline = Instant::now() + inner.request_timeout * 3;
        let resp = retry::call("lock_state.read", deadline, inner.request_timeout, || {
            let (mut c, txn) = (inner.client.clone(), txn.clone());
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        let revision = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut ranges = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().to_vec(),
            _ => Vec::new(),
        });
        let (holds, queue, grants) = (
            ranges.next().unwrap_or_default(),
            ranges.next().unwrap_or_default(),
            ranges.next().unwrap_or_default(),
        );
        let mut foreign_keys = Vec::new();
        let mut foreign = |kv: &etcd_client::KeyValue| {
            foreign_keys.push(ForeignKey {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                lease: LeaseId::new(kv.lease()),
            });
        };
        // Only keys in the bounded ranges matter; of those, the ones of the wrong shape
        // (or, for holds and waiters, with a value that does not parse) are foreign.
        let (holds, queue): (Vec<_>, Vec<_>) = (
            holds
                .into_iter()
                .filter(|kv| keys.in_lease_ranges(kv.key()))
                .collect(),
            queue
                .into_iter()
                .filter(|kv| keys.in_lease_ranges(kv.key()))
                .collect(),
        );
        for kv in &grants {
            if keys.in_lease_ranges(kv.key()) && !keys.is_lease_key(kv.key()) {
                foreign(kv);
            }
        }
        // A hold or waiter of a live session: on the lease its key names.
        let live = |kv: &etcd_client::KeyValue| keys.is_live_entry(kv.key(), kv.lease());
        let parse = |kv: &etcd_client::KeyValue| -> Option<(Meta, Revision)> {
            let meta = Meta::parse(kv.value())?;
            Some((meta, Revision::from_i64(kv.create_revision()).ok()?))
        };
        let mut holders: Vec<Holder> = holds
            .iter()
            .filter_map(|kv| {
                let Some((meta, grant_rev)) = parse(kv).filter(|_| live(kv)) else {
                    foreign(kv);
                    return None;
                };
                Some(Holder {
                    lease: LeaseId::new(kv.lease()),
                    mode: meta.mode,
                    grant_rev,
                    token: FencingToken::from_parts(meta.epoch, grant_rev).ok()?,
                    spiffe_id: meta.spiffe_id,
                    holder_meta: meta.holder_meta,
                })
            })
            .collect();
        holders.sort_by_key(|h| h.grant_rev);
        let mut waiters: Vec<Waiter> = queue
            .iter()
            .filter_map(|kv| {
                let Some((meta, create_rev)) = parse(kv).filter(|_| live(kv)) else {
                    foreign(kv);
                    return None;
                };
                Some(Waiter {
                    lease: LeaseId::new(kv.lease()),
                    mode: meta.mode,
                    create_rev,
                    spiffe_id: meta.spiffe_id,
                    holder_meta: meta.holder_meta,
                })
            })
            .collect();
        waiters.sort_by_key(|w| w.create_rev);
        Ok(LockState {
            revision: Revision::from_i64(revision)
                .map_err(|e| Error::with_source(ErrorKind::Etcd, e))?,
            holders,
            waiters,
            foreign_keys,
        })
    }
}
