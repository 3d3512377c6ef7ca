//! Force release: end someone else's hold, leaving a marker that audit and lock-delay see.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use palisade_fence::Revision;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry;
use palisade_api::keys::{ForceMarker, ForcedGrant};
use palisade_api::validate_key;
use palisade_api::{validate_name, LeaseId, Mode};

impl Locker {
    /// Deletes the hold of `holder` on `lock` (in `mode`) and marks its grant record as
    /// forced, in one Txn. Returns the revision of that Txn. The lock is then granted
    /// again only after the class's lock-delay, as after an expiry. The former holder's
    /// [`Hold::release`](crate::Hold::release) returns [`ErrorKind::NotHeld`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] for a bad name or key (nothing written);
    /// [`ErrorKind::NotHeld`] if that lease holds no such hold;
    /// [`ErrorKind::QuorumLost`] if etcd could not commit in time.
    pub async fn force_release(
        &self,
        lock: &LockName,
        holder: LeaseId,
        mode: Mode,
        marker: &ForceMarker,
    ) -> Result<Revision> {
        self.force_release_at(lock, holder, mode, None, marker)
            .await
    }

    /// [`force_release`](Locker::force_release) of exactly the hold granted at
    /// `grant_rev`: a later hold of the same lease on the lock is [`ErrorKind::NotHeld`],
    /// so repeating the call never deletes another hold.
    ///
    /// # Errors
    ///
    /// As [`force_release`](Locker::force_release).
    pub async fn force_release_grant(
        &self,
        lock: &LockName,
        holder: LeaseId,
        mode: Mode,
        grant_rev: Revision,
        marker: &ForceMarker,
    ) -> Result<Revision> {
        self.force_release_at(lock, holder, mode, Some(grant_rev), marker)
            .await
    }

    async fn force_release_at(
        &self,
        lock: &LockName,
        holder: LeaseId,
        mode: Mode,
        grant_rev: Option<Revision>,
        marker: &ForceMarker,
    ) -> Result<Revision> {
        validate_name(&lock.ns)?;
        validate_name(&lock.class)?;
        validate_key(&lock.key)?;
        let inner = &self.inner;
        let keys = inner.keys.lock(&lock.ns, &lock.class, &lock.key);
        let hold = keys.hold(mode, holder);
        let value = serde_json::to_vec(&ForcedGrant {
            forced: std::borrow::Cow::Borrowed(marker),
        })
        .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
        let txn = Txn::new()
            .when([match grant_rev {
                Some(rev) => Compare::create_revision(
                    hold.clone(),
                    CompareOp::Equal,
                    i64::try_from(rev.get()).unwrap_or(i64::MAX),
                ),
                None => Compare::create_revision(hold.clone(), CompareOp::Greater, 0),
            }])
            .and_then([
                TxnOp::delete(hold, None),
                TxnOp::put(keys.grant(mode, holder), value, None),
            ]);
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
}
