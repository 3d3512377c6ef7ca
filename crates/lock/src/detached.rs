//! Sessions addressed by lease id, for a service that keeps no state of its own.
//!
//! A [`Session`] owns its lease and its keepalive task, so it lives in one process. A
//! service with several replicas cannot keep one: the next request of the same client
//! may land on another replica. Here the lease id *is* the session, and everything the
//! service needs to know about it lives in etcd:
//!
//! - [`Locker::open_detached_session`] grants a lease and writes a [`SessionRecord`] at
//!   `<root>sessions/<lease>`, attached to the lease, so it disappears with it. It names
//!   the owner's SPIFFE ID, which any replica checks before acting for the session.
//! - [`Locker::keep_alive_once`] renews the lease once (one `LeaseKeepAlive` exchange).
//! - [`Locker::attach_session`] gives a [`Session`] handle for acquiring on that lease;
//!   it runs no keepalive and never revokes the lease on drop.
//! - [`Locker::release_by`] releases a hold from its `(lock, lease, mode, grant_rev)`.
//! - [`Locker::revoke_session`] revokes the lease, which ends every hold on it.

use std::time::Duration;

use etcd_client::PutOptions;
use palisade_fence::Revision;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::config_store::decode;
use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::hold::release_lease_txn;
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry::{self, CallError};
use crate::session::Session;
use palisade_api::validate_key;
use palisade_api::{validate_name, LeaseId, Mode, SpiffeId};

/// A session as recorded in etcd at `<root>sessions/<lease>` (JSON, attached to the
/// lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session's lease.
    pub lease: LeaseId,
    /// The owner: only this identity may keep the session alive, release its holds or
    /// close it (the service enforces this).
    pub spiffe_id: SpiffeId,
    /// The lease's TTL, in whole seconds (JSON: milliseconds).
    #[serde(with = "palisade_api::millis")]
    pub ttl: Duration,
    /// The revision that wrote the record (its key's create revision; not in the JSON).
    #[serde(skip)]
    pub opened_rev: Revision,
}

/// Checks that etcd can express `ttl` as a lease TTL: whole seconds, at least one.
pub(crate) fn check_lease_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_secs(1) || ttl.subsec_nanos() != 0 || ttl.as_secs() > i64::MAX as u64 {
        return Err(Error::invalid(InvalidInput::BadTtl(ttl)));
    }
    Ok(())
}

impl Locker {
    fn op_deadline(&self) -> Instant {
        Instant::now() + self.inner.request_timeout.max(Duration::from_millis(500)) * 3
    }

    /// Grants a lease of `ttl` and records its owner, without starting a keepalive: the
    /// caller renews it with [`Locker::keep_alive_once`] at least once per TTL.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadTtl`] (nothing written); [`ErrorKind::QuorumLost`] if etcd
    /// cannot grant the lease or write the record (a lease granted without its record is
    /// revoked, or expires after `ttl`).
    pub async fn open_detached_session(
        &self,
        spiffe_id: SpiffeId,
        ttl: Duration,
    ) -> Result<SessionRecord> {
        check_lease_ttl(ttl)?;
        let inner = &self.inner;
        let grant = retry::call(
            "session.lease_grant",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let mut c = inner.client.clone();
                async move { c.lease_grant(ttl.as_secs() as i64, None).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        let lease = LeaseId::new(grant.id());
        let key = inner.keys.session(lease);
        let mut record = SessionRecord {
            lease,
            spiffe_id,
            ttl,
            opened_rev: Revision::default(),
        };
        let value = serde_json::to_vec(&record)
            .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
        let put = retry::call(
            "session.record_put",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let (mut c, key, value) = (inner.client.clone(), key.clone(), value.clone());
                async move {
                    c.put(key, value, Some(PutOptions::new().with_lease(lease.get())))
                        .await
                }
            },
        )
        .await;
        match put {
            Ok(resp) => {
                let rev = resp.header().map_or(0, |h| h.revision());
                record.opened_rev = Revision::from_i64(rev).unwrap_or_default();
                Ok(record)
            }
            Err(e) => {
                let mut c = inner.client.clone();
                let _ =
                    tokio::time::timeout(inner.request_timeout, c.lease_revoke(lease.get())).await;
                Err(e.into_error(ErrorKind::QuorumLost))
            }
        }
    }

    /// The record of a live session.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SessionLost`] if no live session has this lease (expired, revoked,
    /// or never opened as a detached session); [`ErrorKind::CorruptRecord`];
    /// [`ErrorKind::QuorumLost`].
    pub async fn session_record(&self, lease: LeaseId) -> Result<SessionRecord> {
        let inner = &self.inner;
        let key = inner.keys.session(lease);
        let resp = retry::call(
            "session.record_get",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let (mut c, key) = (inner.client.clone(), key.clone());
                async move { c.get(key, None).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        match resp.kvs().first() {
            Some(kv) if kv.lease() == lease.get() => {
                let mut record: SessionRecord = decode(kv.value())?;
                record.opened_rev = Revision::from_i64(kv.create_revision()).unwrap_or_default();
                Ok(record)
            }
            _ => Err(Error::new(ErrorKind::SessionLost)),
        }
    }

    /// Renews the lease once and returns the TTL etcd granted from now.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SessionLost`] if the lease is gone; [`ErrorKind::QuorumLost`] if etcd
    /// did not answer in time.
    pub async fn keep_alive_once(&self, lease: LeaseId) -> Result<Duration> {
        let inner = &self.inner;
        let resp = retry::call(
            "session.keepalive",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let mut c = inner.client.clone();
                async move {
                    let (mut keeper, mut stream) = c.lease_keep_alive(lease.get()).await?;
                    keeper.keep_alive().await?;
                    stream.message().await
                }
            },
        )
        .await
        .map_err(|e| match e {
            // etcd-client's own answer for a lease etcd no longer knows.
            CallError::Fatal(e @ etcd_client::Error::LeaseKeepAliveError(_)) => {
                Error::with_source(ErrorKind::SessionLost, e)
            }
            e => e.into_error(ErrorKind::QuorumLost),
        })?;
        match resp {
            Some(r) if r.ttl() > 0 => Ok(Duration::from_secs(r.ttl() as u64)),
            // TTL 0 (or no answer on the stream): etcd's answer for a lease that is gone.
            _ => Err(Error::new(ErrorKind::SessionLost)),
        }
    }

    /// Revokes the lease: every hold and waiter key on it is deleted in one revision.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SessionLost`] if the lease was already gone; [`ErrorKind::QuorumLost`].
    pub async fn revoke_session(&self, lease: LeaseId) -> Result<()> {
        let inner = &self.inner;
        retry::call(
            "session.revoke",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let mut c = inner.client.clone();
                async move { c.lease_revoke(lease.get()).await }
            },
        )
        .await
        .map(drop)
        .map_err(|e| match e {
            CallError::LeaseGone(e) => Error::with_source(ErrorKind::SessionLost, e),
            e => e.into_error(ErrorKind::QuorumLost),
        })
    }

    /// A [`Session`] handle on a recorded lease, for [`Locker::acquire`]. It runs no
    /// keepalive, never revokes the lease, and its [`Session::lost`] does not fire on
    /// expiry; an acquire on a lease that is gone fails with [`ErrorKind::SessionLost`].
    /// Call [`Hold::forget`](crate::Hold::forget) on the holds it yields unless this
    /// process means to release them.
    pub fn attach_session(&self, record: &SessionRecord) -> Session {
        Session::attached(
            self.inner.client.clone(),
            record.lease,
            record.spiffe_id.clone(),
            record.ttl,
            record.opened_rev,
            self.inner.request_timeout,
        )
    }

    /// Releases the hold of `lease` on `lock` in `mode` that was granted at `grant_rev`:
    /// the same Txn as [`Hold::release`](crate::Hold::release), so audit sees a release.
    /// If the hold was let go of with [`Hold::forget`](crate::Hold::forget) through this
    /// locker, the release hands the lock over to the waiter the hold would have.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`] for a bad name or key; [`ErrorKind::NotHeld`] if no
    /// such hold exists (released, expired, force-released, or another grant);
    /// [`ErrorKind::QuorumLost`].
    pub async fn release_by(
        &self,
        lock: &LockName,
        lease: LeaseId,
        mode: Mode,
        grant_rev: Revision,
    ) -> Result<()> {
        validate_name(&lock.ns)?;
        validate_name(&lock.class)?;
        validate_key(&lock.key)?;
        let keys = self.inner.keys.lock(&lock.ns, &lock.class, &lock.key);
        let hold_key = keys.hold(mode, lease);
        let to = self.inner.successors.take(hold_key.clone(), grant_rev);
        let result =
            release_lease_txn(&self.inner, &keys, mode, lease, grant_rev, to.as_ref()).await;
        if let (Err(e), Some(to)) = (&result, to) {
            if e.is_quorum_lost() {
                // Not released (or not known to be): a retry hands over as this one would.
                self.inner.successors.keep(hold_key, grant_rev, to);
            }
        }
        result
    }
}
