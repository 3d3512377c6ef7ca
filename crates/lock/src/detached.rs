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

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use palisade_fence::Revision;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::config_store::decode;
use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::hold::{release_lease_txn, ReleaseExtras};
use crate::locker::Locker;
use crate::name::LockName;
use crate::retry::{self, CallError};
use crate::session::Session;
use palisade_api::keys::ForcedNotice;
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
    /// The holds of this session that were force-released while it lived, oldest grant
    /// first (read with the record; not in the JSON).
    #[serde(skip)]
    pub forced: Vec<ForcedNotice>,
}

impl SessionRecord {
    /// The force notice of the hold granted at `grant_rev`, if it was force-released.
    pub fn forced_grant(&self, grant_rev: Revision) -> Option<&ForcedNotice> {
        self.forced.iter().find(|n| n.grant_rev == grant_rev.get())
    }
}

/// Checks that etcd can express `ttl` as a lease TTL: whole seconds, at least one.
pub(crate) fn check_lease_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_secs(1) || ttl.subsec_nanos() != 0 || ttl.as_secs() > i64::MAX as u64 {
        return Err(Error::invalid(InvalidInput::BadTtl(ttl)));
    }
    Ok(())
}

/// The revision of a response header (0 without one).
fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Revision {
    Revision::from_i64(header.map_or(0, etcd_client::ResponseHeader::revision)).unwrap_or_default()
}

impl Locker {
    fn op_deadline(&self) -> Instant {
        Instant::now() + self.inner.request_timeout.max(Duration::from_millis(500)) * 3
    }

    /// Grants a lease of `ttl` and records its owner, without starting a keepalive: the
    /// caller renews it with [`Locker::keep_alive_once`] at least once per TTL. The
    /// record's `ttl` is the TTL etcd granted, which can be longer than `ttl` (etcd's
    /// minimum lease TTL is about 1.5 election timeouts, 2 s with its default settings).
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
        self.open_detached_session_limited(spiffe_id, ttl, None)
            .await
    }

    /// [`open_detached_session`](Locker::open_detached_session), refused when
    /// `spiffe_id` already has `limit` open sessions opened this way (counted across
    /// every locker on the cluster: one key per session under `owners/<id>/`, on the
    /// session's lease, taken as `held_lease_quota` slots are: count at a revision, then
    /// a Txn that commits only if no key of the identity was created since).
    ///
    /// # Errors
    ///
    /// As [`open_detached_session`](Locker::open_detached_session), and
    /// [`ErrorKind::SessionLimit`] when the identity has `limit` sessions (the lease
    /// granted for it is revoked).
    pub async fn open_detached_session_limited(
        &self,
        spiffe_id: SpiffeId,
        ttl: Duration,
        limit: Option<u32>,
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
        // etcd raises a TTL below its minimum: the granted TTL is the session's.
        let granted = u64::try_from(grant.ttl())
            .ok()
            .filter(|&s| s > 0)
            .map_or(ttl, Duration::from_secs);
        let mut record = SessionRecord {
            lease,
            spiffe_id,
            ttl: granted,
            opened_rev: Revision::default(),
            forced: Vec::new(),
        };
        let value = serde_json::to_vec(&record)
            .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
        match self.record_session(&record, value, limit).await {
            Ok(rev) => {
                record.opened_rev = rev;
                Ok(record)
            }
            Err(e) => {
                let mut c = inner.client.clone();
                let _ =
                    tokio::time::timeout(inner.request_timeout, c.lease_revoke(lease.get())).await;
                Err(e)
            }
        }
    }

    /// How many sessions `spiffe_id` has open on this etcd cluster that count against a
    /// per-identity limit (those opened by
    /// [`open_detached_session_limited`](Locker::open_detached_session_limited) with a
    /// limit): its keys under `owners/<id>/`, counted at one revision. A service of
    /// several tiers adds the other tiers' counts to hold one limit across them.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuorumLost`] if etcd does not answer in time.
    pub async fn open_sessions_of(&self, spiffe_id: &SpiffeId) -> Result<u32> {
        let inner = &self.inner;
        let prefix = inner.keys.owner_sessions(spiffe_id.as_str());
        let end = palisade_api::keys::prefix_end(&prefix);
        let resp = retry::call(
            "session.owner_count",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let (mut c, prefix, end) = (inner.client.clone(), prefix.clone(), end.clone());
                async move {
                    c.get(
                        prefix,
                        Some(GetOptions::new().with_range(end).with_count_only()),
                    )
                    .await
                }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        Ok(u32::try_from(resp.count()).unwrap_or(u32::MAX))
    }

    /// Puts the session's record (and, with a limit, its key under `owners/`) on its
    /// lease; the revision of the put.
    async fn record_session(
        &self,
        record: &SessionRecord,
        value: Vec<u8>,
        limit: Option<u32>,
    ) -> Result<Revision> {
        let inner = &self.inner;
        let lease = record.lease;
        let on_lease = || Some(PutOptions::new().with_lease(lease.get()));
        let mut ops = vec![TxnOp::put(inner.keys.session(lease), value, on_lease())];
        let deadline = self.op_deadline();
        let Some(limit) = limit else {
            let txn = Txn::new().and_then(ops);
            let resp = retry::call(
                "session.record_put",
                deadline,
                inner.request_timeout,
                || {
                    let (mut c, txn) = (inner.client.clone(), txn.clone());
                    async move { c.txn(txn).await }
                },
            )
            .await
            .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
            return Ok(header_revision(resp.header()));
        };
        let owner = record.spiffe_id.as_str();
        let prefix = inner.keys.owner_sessions(owner);
        ops.push(TxnOp::put(
            inner.keys.owner_session(owner, lease),
            Vec::new(),
            on_lease(),
        ));
        let counted = crate::quota::CountedPut {
            spans: ["session.owner_count", "session.owner_take"],
            prefix: &prefix,
            limit,
            ops,
            deadline,
        };
        match counted.commit(self).await? {
            Some(rev) => Ok(rev),
            None => Err(Error::new(ErrorKind::SessionLimit { limit })),
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
        self.read_session_record(lease).await.inspect_err(|e| {
            if e.is_session_lost() {
                self.inner.sessions.forget(lease);
            }
        })
    }

    /// The record of a live session as [`Locker::session_record`] reads it, or this
    /// locker's cached copy of it (the first call for a session reads it; the cache is
    /// kept by a watch on `<root>sessions/`). A cached record has no force notices
    /// (`forced` is empty) and may be stale: [`Locker::acquire_in_quota`] and
    /// [`Locker::release_in_session`] compare its `opened_rev` in their Txns, so a
    /// stale one fails them (and is dropped) rather than act for a session that is gone
    /// or replaced.
    ///
    /// # Errors
    ///
    /// As [`Locker::session_record`].
    pub async fn session_record_cached(&self, lease: LeaseId) -> Result<SessionRecord> {
        let inner = &self.inner;
        inner
            .sessions
            .start(&inner.client, &inner.keys.sessions(), inner.request_timeout);
        if let Some(record) = inner.sessions.get(lease) {
            return Ok(record);
        }
        let generation = inner.sessions.generation();
        let record = self.session_record(lease).await?;
        inner.sessions.fill(generation, &record);
        Ok(record)
    }

    /// Drops this locker's cached record of `lease` (see
    /// [`Locker::session_record_cached`]), so the next call reads it.
    pub fn forget_session(&self, lease: LeaseId) {
        self.inner.sessions.forget(lease);
    }

    async fn read_session_record(&self, lease: LeaseId) -> Result<SessionRecord> {
        let inner = &self.inner;
        // One Range: the record and the notices of holds forced while it lived.
        let (start, end) = inner.keys.session_range(lease);
        let resp = retry::call(
            "session.record_get",
            self.op_deadline(),
            inner.request_timeout,
            || {
                let (mut c, start, end) = (inner.client.clone(), start.clone(), end.clone());
                async move { c.get(start, Some(GetOptions::new().with_range(end))).await }
            },
        )
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        let mut kvs = resp.kvs().iter().filter(|kv| kv.lease() == lease.get());
        // The record sorts first: its key is a prefix of every notice's.
        let Some(kv) = kvs.next().filter(|kv| kv.key() == start.as_bytes()) else {
            return Err(Error::new(ErrorKind::SessionLost));
        };
        let mut record: SessionRecord = decode(kv.value())?;
        record.opened_rev = Revision::from_i64(kv.create_revision()).unwrap_or_default();
        record.forced = kvs
            .map(|kv| decode::<ForcedNotice>(kv.value()))
            .collect::<Result<_>>()?;
        Ok(record)
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
        })
        .inspect_err(|e| {
            if e.is_session_lost() {
                self.inner.sessions.forget(lease);
            }
        })?;
        match resp {
            Some(r) if r.ttl() > 0 => Ok(Duration::from_secs(r.ttl() as u64)),
            // TTL 0 (or no answer on the stream): etcd's answer for a lease that is gone.
            _ => {
                self.inner.sessions.forget(lease);
                Err(Error::new(ErrorKind::SessionLost))
            }
        }
    }

    /// Revokes the lease: every hold and waiter key on it is deleted in one revision.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SessionLost`] if the lease was already gone; [`ErrorKind::QuorumLost`].
    pub async fn revoke_session(&self, lease: LeaseId) -> Result<()> {
        let inner = &self.inner;
        inner.sessions.forget(lease);
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
    /// locker, the release hands the lock over to the waiter the hold would have. The
    /// same Txn deletes the hold's `held_lease_quota` slot
    /// ([`Locker::acquire_in_quota`]), if any (known to this locker if it took it, else
    /// read first): a slot is freed only with its hold, never by a release that found no
    /// such hold.
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
        self.release_as(lock, lease, None, mode, grant_rev).await
    }

    /// [`release_by`](Locker::release_by) for the session of `record`, whose Txn also
    /// compares that the session's record is still the one `record` was read from (its
    /// `opened_rev`, as [`Locker::session_record_cached`] may serve it).
    ///
    /// # Errors
    ///
    /// As [`release_by`](Locker::release_by); [`ErrorKind::NotHeld`] also when the
    /// session's record is gone or replaced (this locker's cache of it is dropped: read
    /// it again to tell why).
    pub async fn release_in_session(
        &self,
        lock: &LockName,
        record: &SessionRecord,
        mode: Mode,
        grant_rev: Revision,
    ) -> Result<()> {
        self.release_as(lock, record.lease, Some(record.opened_rev), mode, grant_rev)
            .await
            .inspect_err(|e| {
                if e.is_not_held() {
                    self.inner.sessions.forget(record.lease);
                }
            })
    }

    async fn release_as(
        &self,
        lock: &LockName,
        lease: LeaseId,
        opened_rev: Option<Revision>,
        mode: Mode,
        grant_rev: Revision,
    ) -> Result<()> {
        validate_name(&lock.ns)?;
        validate_name(&lock.class)?;
        validate_key(&lock.key)?;
        let keys = self.inner.keys.lock(&lock.ns, &lock.class, &lock.key);
        let slot = self.quota_slot_of(lock, lease, mode).await?;
        let mut extras = ReleaseExtras::default();
        if let Some(rev) = opened_rev {
            extras.when.push(Compare::create_revision(
                self.inner.keys.session(lease),
                CompareOp::Equal,
                rev.as_i64(),
            ));
        }
        extras.ops.extend(slot.as_ref().map(crate::quota::free_op));
        let hold_key = keys.hold(mode, lease);
        let to = self.inner.successors.take(hold_key.clone(), grant_rev);
        let result = release_lease_txn(
            &self.inner,
            &keys,
            mode,
            lease,
            grant_rev,
            to.as_ref(),
            extras,
        )
        .await;
        if result.is_err() {
            if let Some(slot) = slot {
                // Not freed (or not known to be): a retry frees it as this one would.
                self.keep_quota_slot(lock, lease, mode, slot);
            }
        }
        if let (Err(e), Some(to)) = (&result, to) {
            if e.is_quorum_lost() {
                // Not released (or not known to be): a retry hands over as this one would.
                self.inner.successors.keep(hold_key, grant_rev, to);
            }
        }
        result
    }
}
