//! Force release: end someone else's hold, leaving a marker that audit and lock-delay
//! see, and a notice that the holder's session reads.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use palisade_fence::Revision;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry;
use palisade_api::keys::{ForceMarker, ForcedGrant, ForcedNotice};
use palisade_api::validate_key;
use palisade_api::{validate_name, LeaseId, Mode};

impl Locker {
    /// Force-releases the hold that `holder` has on `lock` in `mode` now: reads its
    /// grant revision, then [`force_release_grant`](Locker::force_release_grant) of
    /// exactly that grant. Returns the revision of the force Txn.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] for a bad name or key (nothing written);
    /// [`ErrorKind::NotHeld`] if that lease holds no such hold (or it was replaced
    /// between the read and the Txn); [`ErrorKind::QuorumLost`] if etcd could not commit
    /// in time.
    pub async fn force_release(
        &self,
        lock: &LockName,
        holder: LeaseId,
        mode: Mode,
        marker: &ForceMarker,
    ) -> Result<Revision> {
        check_lock(lock)?;
        let inner = &self.inner;
        let hold = inner
            .keys
            .lock(&lock.ns, &lock.class, &lock.key)
            .hold(mode, holder);
        let deadline = Instant::now() + inner.request_timeout * 3;
        let resp = retry::call(
            "force_release.read",
            deadline,
            inner.request_timeout,
            || {
                let (mut c, hold) = (inner.client.clone(), hold.clone());
                async move { c.get(hold, None).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        let grant_rev = resp
            .kvs()
            .first()
            .filter(|kv| kv.lease() == holder.get())
            .and_then(|kv| Revision::from_i64(kv.create_revision()).ok())
            .ok_or_else(|| Error::new(ErrorKind::NotHeld))?;
        self.force_release_grant(lock, holder, mode, grant_rev, marker)
            .await
    }

    /// Deletes the hold of `holder` on `lock` (in `mode`) that was granted at
    /// `grant_rev`, in one Txn that also:
    ///
    /// - puts (or rewrites) its grant record as a [`ForcedGrant`] (audit tells a force
    ///   from an expiry by it; the lock is granted again only after the class's
    ///   lock-delay, as after an expiry);
    /// - puts a [`ForcedNotice`] at `sessions/<lease>/forced/<grant_rev>` on the holder's
    ///   lease, so the holder's session learns of it ([`Locker::session_record`] reads
    ///   it with the record);
    /// - deletes the hold's `held_lease_quota` slot: the hold is gone.
    ///
    /// Any other hold (a later grant of the same lease on the lock) fails the compare,
    /// so repeating the call never deletes another hold. Returns the revision of the Txn.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] for a bad name or key (nothing written);
    /// [`ErrorKind::NotHeld`] if no hold of that lease on the lock has that grant
    /// revision (released, expired, forced, or replaced by a later grant);
    /// [`ErrorKind::QuorumLost`] if etcd could not commit in time.
    pub async fn force_release_grant(
        &self,
        lock: &LockName,
        holder: LeaseId,
        mode: Mode,
        grant_rev: Revision,
        marker: &ForceMarker,
    ) -> Result<Revision> {
        check_lock(lock)?;
        let inner = &self.inner;
        let keys = inner.keys.lock(&lock.ns, &lock.class, &lock.key);
        let hold = keys.hold(mode, holder);
        let corrupt = |e| Error::with_source(ErrorKind::CorruptRecord, e);
        let value = serde_json::to_vec(&ForcedGrant {
            forced: std::borrow::Cow::Borrowed(marker),
        })
        .map_err(corrupt)?;
        let notice = serde_json::to_vec(&ForcedNotice {
            namespace: lock.ns.clone(),
            class: lock.class.clone(),
            key: lock.key.clone(),
            mode,
            grant_rev: grant_rev.get(),
            request_id: marker.request_id.clone(),
        })
        .map_err(corrupt)?;
        // The hold's quota slot, freed in the same Txn (its value compared).
        let slot = self.quota_slot_of(lock, holder, mode).await?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(hold.clone(), CompareOp::Equal, grant_rev.as_i64()),
                Compare::lease(hold.clone(), CompareOp::Equal, holder.get()),
            ])
            .and_then(
                [
                    TxnOp::delete(hold, None),
                    TxnOp::put(keys.grant(mode, holder), value, None),
                    TxnOp::put(
                        inner.keys.session_forced(holder, grant_rev.get()),
                        notice,
                        Some(PutOptions::new().with_lease(holder.get())),
                    ),
                ]
                .into_iter()
                .chain(slot.as_ref().map(crate::quota::free_op))
                .collect::<Vec<_>>(),
            );
        let deadline = Instant::now() + inner.request_timeout * 3;
        let resp = retry::call("force_release.txn", deadline, inner.request_timeout, || {
            let (mut c, txn) = (inner.client.clone(), txn.clone());
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        if !resp.succeeded() {
            return Err(Error::new(ErrorKind::NotHeld));
        }
        let rev = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        Revision::from_i64(rev).map_err(|e| Error::with_source(ErrorKind::Etcd, e))
    }

    /// Whether the grant record of `holder` on `lock` in `mode` is a force marker of
    /// request `request_id`, and the revision that wrote it: how a retried approval
    /// tells a hold it deleted itself (before its answer was lost) from one that ended
    /// otherwise. `None` once the next grant of the lock consumed the record.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`]; [`ErrorKind::QuorumLost`].
    pub async fn forced_by(
        &self,
        lock: &LockName,
        holder: LeaseId,
        mode: Mode,
        request_id: &str,
    ) -> Result<Option<Revision>> {
        check_lock(lock)?;
        let inner = &self.inner;
        let grant = inner
            .keys
            .lock(&lock.ns, &lock.class, &lock.key)
            .grant(mode, holder);
        let deadline = Instant::now() + inner.request_timeout * 3;
        let resp = retry::call(
            "force_release.check",
            deadline,
            inner.request_timeout,
            || {
                let (mut c, grant) = (inner.client.clone(), grant.clone());
                async move { c.get(grant, None).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        Ok(resp.kvs().first().and_then(|kv| {
            let forced: ForcedGrant<'_> = serde_json::from_slice(kv.value()).ok()?;
            (forced.forced.request_id == request_id)
                .then(|| Revision::from_i64(kv.mod_revision()).ok())
                .flatten()
        }))
    }
}

fn check_lock(lock: &LockName) -> Result<()> {
    validate_name(&lock.ns)?;
    validate_name(&lock.class)?;
    validate_key(&lock.key)?;
    Ok(())
}
