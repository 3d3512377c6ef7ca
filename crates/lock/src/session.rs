//! A session: one etcd lease, one SPIFFE ID, one keepalive task, one loss signal.
//!
//! Like Go etcd's `concurrency.Session`, the session owns the lease and the only
//! keepalive loop; every hold of the session attaches to the lease, so one keepalive
//! renews them all, and the holds learn of loss from the session's signal.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, PutOptions};
use palisade_fence::Revision;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::retry::{self, Backoff};
use palisade_api::{LeaseId, SpiffeId};

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// etcd reported the lease gone (expired or revoked elsewhere).
    LeaseGone,
    /// No keepalive succeeded for a whole TTL (measured from when the last successful
    /// renewal was *sent*, so the signal fires no later than etcd expires the lease).
    KeepaliveFailed,
    /// [`Session::close`] revoked the lease.
    Closed,
}

pub(crate) struct SessionInner {
    pub(crate) client: Client,
    pub(crate) lease: LeaseId,
    pub(crate) spiffe_id: SpiffeId,
    pub(crate) ttl: Duration,
    pub(crate) opened_rev: Revision,
    pub(crate) request_timeout: Duration,
    lost_tx: watch::Sender<Option<LossReason>>,
    renewing: watch::Sender<bool>,
    keepalive: Mutex<Option<JoinHandle<()>>>,
    /// Lock base paths this session holds or waits for; one acquire per lock at a time.
    pub(crate) busy: Mutex<HashSet<String>>,
    /// Acquires of this handle that were dropped and whose cleanup has not finished, as
    /// `(lock base, attempt id)`: keys they left are no other live acquire's, so the
    /// session's next acquire of the lock goes on over them (see `AcquireAttempt`).
    abandoned: Mutex<HashSet<(String, u64)>>,
    /// Attached to a lease owned elsewhere: no keepalive, no revoke on drop.
    detached: bool,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        if let Some(task) = self
            .keepalive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
        // The last handle is gone: revoke the lease so its holds end now rather than
        // after the TTL. Best effort; the TTL is the backstop. An attached handle does
        // not own the lease and leaves it alone.
        if !self.detached && self.lost_tx.borrow().is_none() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let mut client = self.client.clone();
                let lease = self.lease.get();
                rt.spawn(async move {
                    let _ = client.lease_revoke(lease).await;
                });
            }
        }
    }
}

/// etcd's largest lease TTL (`MaxLeaseTTL`), in seconds.
pub(crate) const MAX_LEASE_TTL_SECS: u64 = 9_000_000_000;

/// A lock session: one etcd lease with a TTL, owned by one SPIFFE ID.
///
/// Cloning is cheap and shares the session. The lease is kept alive by one task owned by
/// the session; [`Session::lost`] completes when the lease is gone or cannot be renewed
/// for a whole TTL. [`Session::close`] revokes the lease, which ends every hold on it.
/// Dropping the last handle (the session and all its holds) revokes it too, best effort.
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &self.inner.lease)
            .field("spiffe_id", &self.inner.spiffe_id)
            .field("ttl", &self.inner.ttl)
            .finish()
    }
}

impl Session {
    /// Grants a lease of `ttl`, puts its lease marker (`marker`, the key layout's
    /// `leases/<lease>`, on the lease) and starts its keepalive. A lease whose marker
    /// could not be put is revoked (best effort) and the open fails: every session's
    /// lease carries a marker, whose deletion tells an expiry from a release.
    pub(crate) async fn open(
        client: Client,
        spiffe_id: SpiffeId,
        ttl: Duration,
        request_timeout: Duration,
        marker: impl Fn(LeaseId) -> String,
    ) -> Result<Session> {
        if ttl < Duration::from_secs(1)
            || ttl.subsec_nanos() != 0
            || ttl.as_secs() > MAX_LEASE_TTL_SECS
        {
            return Err(Error::invalid(InvalidInput::BadTtl(ttl)));
        }
        let deadline = Instant::now() + request_timeout.max(Duration::from_secs(5));
        let sent_at = Instant::now();
        let resp = retry::call("session.lease_grant", deadline, request_timeout, || {
            let mut c = client.clone();
            async move { c.lease_grant(ttl.as_secs() as i64, None).await }
        })
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))?;
        let lease = LeaseId::new(resp.id());
        let key = marker(lease);
        let put = retry::call("session.marker", deadline, request_timeout, || {
            let (mut c, key) = (client.clone(), key.clone());
            let opts = PutOptions::new().with_lease(lease.get());
            async move { c.put(key, Vec::new(), Some(opts)).await }
        })
        .await;
        if let Err(e) = put {
            let mut c = client.clone();
            let _ = tokio::time::timeout(request_timeout, c.lease_revoke(lease.get())).await;
            return Err(e.into_error(ErrorKind::QuorumLost));
        }
        let opened_rev = resp.header().map(|h| h.revision()).unwrap_or_default();
        // etcd may grant more than asked (its minimum lease TTL, 2 s on etcd 3.4 and 3.5
        // with default settings): the session runs on what was granted.
        let ttl = Duration::from_secs(resp.ttl().max(1) as u64);
        let (lost_tx, _) = watch::channel(None);
        let (renewing, _) = watch::channel(true);
        let inner = Arc::new(SessionInner {
            client,
            lease,
            spiffe_id,
            ttl,
            opened_rev: Revision::from_i64(opened_rev).unwrap_or_default(),
            request_timeout,
            lost_tx,
            renewing,
            keepalive: Mutex::new(None),
            busy: Mutex::new(HashSet::new()),
            abandoned: Mutex::new(HashSet::new()),
            detached: false,
        });
        let task = tokio::spawn(keepalive(
            Arc::downgrade(&inner),
            sent_at + Duration::from_secs(resp.ttl().max(0) as u64),
        ));
        *inner.keepalive.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(Session { inner })
    }

    /// A handle on a lease that lives on its own (kept alive and revoked by whoever
    /// owns it, through lease-id operations): no keepalive task, no revoke on drop, and
    /// [`Session::lost`] fires only on [`Session::close`]. Acquires through it still fail
    /// with [`ErrorKind::SessionLost`] once the lease is gone (etcd refuses puts on it).
    pub(crate) fn attached(
        client: Client,
        lease: LeaseId,
        spiffe_id: SpiffeId,
        ttl: Duration,
        opened_rev: Revision,
        request_timeout: Duration,
    ) -> Session {
        let (lost_tx, _) = watch::channel(None);
        let (renewing, _) = watch::channel(false);
        Session {
            inner: Arc::new(SessionInner {
                client,
                lease,
                spiffe_id,
                ttl,
                opened_rev,
                request_timeout,
                lost_tx,
                renewing,
                keepalive: Mutex::new(None),
                busy: Mutex::new(HashSet::new()),
                abandoned: Mutex::new(HashSet::new()),
                detached: true,
            }),
        }
    }

    /// The etcd lease id.
    pub fn lease(&self) -> LeaseId {
        self.inner.lease
    }

    /// The SPIFFE ID the session acts for.
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.inner.spiffe_id
    }

    /// The lease's TTL as etcd granted it: at least the TTL asked for, more if that was
    /// below etcd's minimum lease TTL. Class TTL bounds are checked against this value.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The etcd revision at which the lease was granted.
    pub fn opened_rev(&self) -> Revision {
        self.inner.opened_rev
    }

    /// Why the session ended, or `None` while it is live.
    pub fn loss(&self) -> Option<LossReason> {
        *self.inner.lost_tx.borrow()
    }

    /// Completes when the session ends (lease gone, keepalive failing for a TTL, or
    /// closed), with the reason. Completes at once if it already ended.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.inner.lost_tx.subscribe();
        let r = rx.wait_for(Option::is_some).await;
        match r {
            Ok(v) => v.unwrap_or(LossReason::Closed),
            // The sender lives in `inner`, which `self` keeps alive.
            Err(_) => LossReason::Closed,
        }
    }

    /// Stops renewing the lease without revoking it, as a process that froze would: the
    /// lease and its holds expire after the TTL, and [`Session::lost`] fires when a TTL
    /// has passed since the last renewal was sent. Used to exercise expiry.
    pub fn stop_keepalive(&self) {
        self.inner.renewing.send_replace(false);
    }

    /// Revokes the lease, which deletes every hold and waiter key on it (etcd's lease
    /// semantics), and fires the loss signal with [`LossReason::Closed`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuorumLost`] if etcd did not answer within the request timeout
    /// (the lease then still expires after its TTL); [`ErrorKind::Etcd`] otherwise.
    pub async fn close(self) -> Result<()> {
        if let Some(task) = self
            .inner
            .keepalive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
        self.inner.lost_tx.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(LossReason::Closed);
                true
            } else {
                false
            }
        });
        let deadline = Instant::now() + self.inner.request_timeout * 2;
        let lease = self.inner.lease.get();
        let client = self.inner.client.clone();
        match retry::call(
            "session.revoke",
            deadline,
            self.inner.request_timeout,
            || {
                let mut c = client.clone();
                async move { c.lease_revoke(lease).await }
            },
        )
        .await
        {
            Ok(_) | Err(retry::CallError::LeaseGone(_)) => Ok(()),
            Err(e) => Err(e.into_error(ErrorKind::QuorumLost)),
        }
    }
}

/// The keepalive loop: renew every TTL/3; fire the loss signal when etcd says the lease
/// is gone, or when `expires_at` (last renewal sent + TTL granted) passes.
async fn keepalive(session: std::sync::Weak<SessionInner>, mut expires_at: Instant) {
    let Some(inner) = session.upgrade() else {
        return;
    };
    let (client, lease, ttl, per_request) = (
        inner.client.clone(),
        inner.lease.get(),
        inner.ttl,
        inner.request_timeout,
    );
    let mut renewing = inner.renewing.subscribe();
    let lost_tx = inner.lost_tx.clone();
    drop(inner);
    let fire = |reason| {
        lost_tx.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(reason);
                true
            } else {
                false
            }
        });
    };
    let mut stream = None;
    let mut backoff = Backoff::new();
    let mut next_renewal = Instant::now() + ttl / 3;
    loop {
        if !*renewing.borrow() {
            tokio::time::sleep_until(expires_at).await;
            fire(LossReason::KeepaliveFailed);
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(expires_at) => {
                fire(LossReason::KeepaliveFailed);
                return;
            }
            _ = renewing.changed() => continue,
            _ = tokio::time::sleep_until(next_renewal) => {}
        }
        let sent_at = Instant::now();
        let attempt_until = (sent_at + per_request).min(expires_at);
        let renewed = tokio::time::timeout_at(attempt_until, async {
            if stream.is_none() {
                let mut c = client.clone();
                stream = Some(c.lease_keep_alive(lease).await?);
            }
            let (keeper, s) = stream.as_mut().expect("set above");
            keeper.keep_alive().await?;
            s.message().await
        })
        .await;
        match renewed {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                expires_at = sent_at + Duration::from_secs(resp.ttl() as u64);
                next_renewal = sent_at + ttl / 3;
                backoff = Backoff::new();
            }
            Ok(Ok(Some(_))) => {
                // TTL 0: etcd's answer for a lease that no longer exists.
                fire(LossReason::LeaseGone);
                return;
            }
            Ok(Err(e)) if retry::classify(&e) == retry::Failure::LeaseGone => {
                fire(LossReason::LeaseGone);
                return;
            }
            _ => {
                // Stream ended, error or timeout: open a new stream and retry soon.
                stream = None;
                backoff.wait(expires_at).await;
                next_renewal = Instant::now();
            }
        }
    }
}

impl Session {
    /// Marks a lock as being acquired or held by this session; false if it already is.
    pub(crate) fn mark_busy(&self, base: &str) -> bool {
        self.inner
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(base.to_owned())
    }

    /// Notes that the acquire `attempt` of the lock at `base` was dropped (`true`), or
    /// that its cleanup finished (`false`).
    pub(crate) fn set_abandoned(&self, base: &str, attempt: u64, abandoned: bool) {
        let mut set = self
            .inner
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if abandoned {
            set.insert((base.to_owned(), attempt));
        } else {
            set.remove(&(base.to_owned(), attempt));
        }
    }

    /// The acquires of the lock at `base` that this handle dropped, and the holds of it
    /// that it let go of, whose cleanup or release has not finished (their attempt ids).
    pub(crate) fn abandoned(&self, base: &str) -> Vec<u64> {
        self.inner
            .abandoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(b, _)| b == base)
            .map(|(_, a)| *a)
            .collect()
    }

    pub(crate) fn unmark_busy(&self, base: &str) {
        self.inner
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(base);
    }
}
