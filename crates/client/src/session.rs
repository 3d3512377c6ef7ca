//! [`Client`] and [`ClientSession`] (one keepalive task).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_api::routes;
use palisade_api::wire::{
    AcquireBody, HoldView, KeepaliveView, OpenSessionBody, ReleaseBody, SessionView,
};
use palisade_fence::Revision;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{ClientError, ClientErrorKind};
use crate::hold::RemoteHold;
use crate::http::Http;
use crate::tls::ClientTls;
use palisade_api::{AttemptId, Mode};

/// A handle on one lock service (any replica). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: Http,
    /// How long opening a session is sent again while the service answers that it
    /// cannot serve it for now (see [`Client::with_unavailable_wait`]).
    open_wait: Duration,
}

/// The default of [`Client::with_unavailable_wait`].
pub const DEFAULT_OPEN_WAIT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// Checks that `base` is the service's base URL, `scheme://host:port` with at most a
/// trailing `/`: every route's path (`/v1/...`) is appended to it, so a path (`/v1`) or a
/// query would send each request to a route the service does not have.
fn check_base(base: &str) -> Result<(), ClientError> {
    let uri: hyper::Uri = base
        .parse()
        .map_err(|e| ClientError::config(format!("lock service URL {base:?}: {e}")))?;
    let path = uri.path();
    if uri.authority().is_none() || !(path.is_empty() || path == "/") || uri.query().is_some() {
        return Err(ClientError::config(format!(
            "lock service URL {base:?} is not a base URL: give scheme://host:port, without a \
             path or query (the client adds /v1/...)"
        )));
    }
    Ok(())
}

impl Client {
    /// A client of a service in dev mode at `base_url` (`http://host:port`), over plain
    /// HTTP; name the caller with [`Client::with_dev_identity`].
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::Config`] if the URL is not `http://...` (use
    /// [`Client::new_mtls`] for `https://`), or is not a base URL
    /// (`scheme://host:port`, at most a trailing `/`: no path, no query).
    pub fn new(base_url: impl Into<String>) -> Result<Client, ClientError> {
        let base = base_url.into();
        if !base.starts_with("http://") {
            return Err(ClientError::config(format!(
                "plain HTTP (dev mode) needs an http:// URL, not {base:?}; use mTLS for https://"
            )));
        }
        check_base(&base)?;
        Ok(Client {
            http: Http::new(base),
            open_wait: DEFAULT_OPEN_WAIT,
        })
    }

    /// A client of a service over mTLS at `base_url` (`https://host:port`): the caller
    /// is the SPIFFE ID of the client certificate in `tls`.
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::Config`] if the URL is not `https://...`, is not a base URL
    /// (`scheme://host:port`, at most a trailing `/`), or rustls refuses the roots,
    /// certificate or key.
    pub fn new_mtls(base_url: impl Into<String>, tls: ClientTls) -> Result<Client, ClientError> {
        let base = base_url.into();
        if !base.starts_with("https://") {
            return Err(ClientError::config(format!(
                "mTLS needs an https:// URL, not {base:?}"
            )));
        }
        check_base(&base)?;
        Ok(Client {
            http: Http::new_tls(base, &tls)?,
            open_wait: DEFAULT_OPEN_WAIT,
        })
    }

    /// Sends `id` in the dev identity header (the service must run in dev mode; a
    /// service on mTLS answers 401 to a request that carries it).
    #[must_use]
    pub fn with_dev_identity(mut self, id: impl Into<String>) -> Self {
        self.http.set_identity(id.into());
        self
    }

    /// How long [`Client::open_session`], [`Client::open_session_in`] and
    /// [`Client::open_session_for`] send the request
    /// again while the service answers 503 `quorum-lost` (etcd could not commit in time)
    /// or `unavailable`: after a pause of 50 ms doubling up to 1 s, with jitter, while
    /// `wait` leaves room for the pause (the policy of [`Client::acquire`]). Default
    /// [`DEFAULT_OPEN_WAIT`] (10 s); zero sends once. A session whose answer was lost
    /// stays open only until its lease ends, since nothing keeps it alive.
    #[must_use]
    pub fn with_unavailable_wait(mut self, wait: Duration) -> Self {
        self.open_wait = wait;
        self
    }

    /// One raw API call, for tools: `method` and `path` (starting with `/v1/`), an
    /// optional JSON body; the JSON answer (`null` for 204).
    ///
    /// # Errors
    ///
    /// [`ClientError`] with the service's problem kind, or a transport error.
    pub async fn call_json(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, ClientError> {
        self.http.send_value(method, path, body).await
    }

    /// [`call_json`](Self::call_json) with the retry policy of [`Client::acquire`]: an
    /// answer that the service cannot serve for now (503 `quorum-lost`) is sent again
    /// after a pause (50 ms doubling up to 1 s, with jitter) while `wait` leaves room for
    /// the pause; then the last answer is returned. For calls that may be repeated: the
    /// CLI opens the session of a `lock acquire` or `lock run` with it (a session that a
    /// lost answer left open ends with its lease, since nothing keeps it alive).
    ///
    /// # Errors
    ///
    /// As [`call_json`](Self::call_json).
    pub async fn call_json_within(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        wait: Duration,
    ) -> Result<serde_json::Value, ClientError> {
        crate::unavailable::retry_within(Instant::now() + wait, |_| {
            self.http.send_value(method, path, body.clone())
        })
        .await
    }

    /// Acquires the lock `body` names for the session it names (one the caller opened,
    /// by id), waiting (long-poll) up to `body.wait_ms`. An answer that the service
    /// cannot serve for now (503 `quorum-lost`: etcd could not commit in time) is sent
    /// again after a pause (50 ms doubling up to 1 s, with jitter) with the time left
    /// of the wait, while that time leaves room for the pause; then the last answer is
    /// returned. The CLI's `lock acquire` uses this. A `wait_ms` of 0 tries once.
    ///
    /// # Errors
    ///
    /// As [`ClientSession::acquire`].
    pub async fn acquire(&self, body: &AcquireBody) -> Result<HoldView, ClientError> {
        acquire(&self.http, body.clone()).await
    }

    /// Releases the hold `body` names, with the retry policy of
    /// [`RemoteHold::release_within`]: sent again while its answer is lost, until a
    /// definite answer or `budget` runs out. For tools that hold no [`RemoteHold`] (the
    /// CLI's `lock release`); nothing goes on in the background.
    ///
    /// # Errors
    ///
    /// As [`RemoteHold::release_within`]:
    /// [`ClientErrorKind::OutcomeUnknown`] when `budget` ran out.
    pub async fn release(&self, body: &ReleaseBody, budget: Duration) -> Result<(), ClientError> {
        crate::release::send(&self.http, body, Instant::now() + budget).await
    }

    /// Opens a session with a lease of `ttl` (whole seconds) and starts its keepalive.
    /// The session names no namespace: it lives on the home tier (see
    /// [`Client::open_session_for`]) and counts against a namespace's `held_lease_quota`
    /// only through its holds and waits (see [`Client::open_session_in`]).
    ///
    /// An answer that the service cannot serve it for now is sent again (see
    /// [`Client::with_unavailable_wait`]).
    ///
    /// # Errors
    ///
    /// [`ClientError`] with the service's problem kind (a 503 `quorum-lost` once the
    /// wait is over), or a transport error.
    pub async fn open_session(&self, ttl: Duration) -> Result<ClientSession, ClientError> {
        self.open(OpenSessionBody {
            ttl_ms: millis(ttl),
            namespace: None,
            tier: None,
            tier_of: None,
        })
        .await
    }

    /// Opens a session in `namespace`: the session itself takes one slot of that
    /// namespace's `held_lease_quota` for as long as it lives (the service's rule), and
    /// starts its keepalive.
    ///
    /// # Errors
    ///
    /// As [`Client::open_session`]; also [`ProblemKind::QuotaExceeded`](crate::ProblemKind::QuotaExceeded)
    /// when the namespace's quota is full, `Forbidden` when the caller may not use the
    /// namespace, `NotFound` when it does not exist.
    pub async fn open_session_in(
        &self,
        namespace: &str,
        ttl: Duration,
    ) -> Result<ClientSession, ClientError> {
        self.open(OpenSessionBody {
            ttl_ms: millis(ttl),
            namespace: Some(namespace.to_owned()),
            tier: None,
            tier_of: None,
        })
        .await
    }

    /// Opens a session on the etcd cluster tier where `namespace` lives (the service
    /// routes it), so that it can acquire that namespace's locks, and starts its
    /// keepalive. Unlike [`Client::open_session_in`] it takes no quota slot of its own.
    /// A service of one tier opens it as [`Client::open_session`] does.
    ///
    /// # Errors
    ///
    /// As [`Client::open_session`]; also `Forbidden` when the caller may not use the
    /// namespace, `NotFound` when it does not exist.
    pub async fn open_session_for(
        &self,
        namespace: &str,
        ttl: Duration,
    ) -> Result<ClientSession, ClientError> {
        self.open(OpenSessionBody {
            ttl_ms: millis(ttl),
            namespace: None,
            tier: None,
            tier_of: Some(namespace.to_owned()),
        })
        .await
    }

    async fn open(&self, body: OpenSessionBody) -> Result<ClientSession, ClientError> {
        // The lease's expiry is reckoned from when the answered attempt was sent.
        let (sent_at, opened): (Instant, SessionView) =
            crate::unavailable::retry_within(Instant::now() + self.open_wait, |_| {
                let sent_at = Instant::now();
                let sent = self.http.send("POST", routes::SESSIONS, Some(json(&body)));
                async move { sent.await.map(|v| (sent_at, v)) }
            })
            .await?;
        let ttl = Duration::from_millis(opened.ttl_ms);
        let (lost, _) = watch::channel(false);
        let (forced, _) = watch::channel(BTreeMap::new());
        let (renewed, _) = watch::channel(sent_at);
        let shared = Arc::new(Shared {
            http: self.http.clone(),
            id: opened.session,
            ttl,
            lost,
            forced,
            renewed,
            keepalive: Mutex::new(None),
            letting_go: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(keepalive(Arc::downgrade(&shared), sent_at + ttl));
        *shared.keepalive.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(ClientSession { shared })
    }
}

struct Shared {
    http: Http,
    id: String,
    ttl: Duration,
    lost: watch::Sender<bool>,
    /// The grants of this session that the service reported force-released, with the
    /// request that ended each.
    forced: watch::Sender<BTreeMap<Revision, String>>,
    /// When the last acknowledged renewal was sent (the open, before the first).
    renewed: watch::Sender<Instant>,
    keepalive: Mutex<Option<JoinHandle<()>>>,
    /// Holds of this session let go of whose release's outcome is still open (it goes
    /// on in the background), by lock: the next acquire of that lock names the hold in
    /// `replaces`, so the service ends it rather than refuse the acquire.
    letting_go: Mutex<HashMap<LockRef, Revision>>,
}

/// A lock as `(namespace, class, key)`.
pub(crate) type LockRef = (String, String, String);

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(t) = self
            .keepalive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.abort();
        }
        if !*self.lost.borrow() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (http, path) = (self.http.clone(), routes::session(&self.id));
                rt.spawn(async move {
                    let _ = http.send_empty("DELETE", &path, None).await;
                });
            }
        }
    }
}

/// Renews every TTL/3; marks the session lost when the service says it is gone or when
/// `expires_at` (last successful renewal sent + TTL) passes, and passes on the holds each
/// renewal reports force-released.
async fn keepalive(shared: std::sync::Weak<Shared>, mut expires_at: Instant) {
    let Some(s) = shared.upgrade() else { return };
    let (http, ttl, lost, forced) = (s.http.clone(), s.ttl, s.lost.clone(), s.forced.clone());
    let renewed = s.renewed.clone();
    let path = routes::keepalive(&s.id);
    drop(s);
    let mut next = Instant::now() + ttl / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(expires_at) => break,
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent_at = Instant::now();
        let attempt =
            tokio::time::timeout_at(expires_at, http.send::<KeepaliveView>("POST", &path, None));
        match attempt.await {
            Ok(Ok(r)) => {
                expires_at = sent_at + Duration::from_millis(r.ttl_ms);
                next = sent_at + ttl / 3;
                renewed.send_replace(sent_at);
                forced.send_if_modified(|known| {
                    let before = known.len();
                    for f in r.forced {
                        known.entry(f.grant_rev).or_insert(f.request_id);
                    }
                    known.len() != before
                });
            }
            Ok(Err(e)) if e.is_session_lost() || e.is_forbidden() => break,
            _ => next = Instant::now() + Duration::from_millis(200),
        }
    }
    lost.send_replace(true);
}

/// A session of the lock service, kept alive by one background task. Cheap to clone;
/// the last handle (session or hold) to go closes it in the background.
#[derive(Clone)]
pub struct ClientSession {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ClientSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSession")
            .field("id", &self.shared.id)
            .field("ttl", &self.shared.ttl)
            .finish()
    }
}

impl ClientSession {
    /// The session id (the etcd lease id, 16 hex digits).
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Completes when the session is gone (see the module docs). Completes at once if it
    /// already is.
    pub async fn lost(&self) {
        let mut rx = self.shared.lost.subscribe();
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// Whether the session is known to be gone.
    pub fn is_lost(&self) -> bool {
        *self.shared.lost.borrow()
    }

    /// The session's TTL, as the service granted it.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// When the last renewal the service acknowledged was sent (before the first one:
    /// when the open was sent). The session counts as alive until then plus
    /// [`ClientSession::ttl`]; after that [`ClientSession::lost`] completes.
    pub fn renewed_at(&self) -> std::time::Instant {
        self.shared.renewed.borrow().into_std()
    }

    /// Completes with the send time of the next acknowledged renewal after `after` (at
    /// once if one is known already); `None` once the session is lost.
    pub async fn renewed_after(&self, after: std::time::Instant) -> Option<std::time::Instant> {
        let mut rx = self.shared.renewed.subscribe();
        let mut lost = self.shared.lost.subscribe();
        loop {
            let at = rx.borrow_and_update().into_std();
            if at > after {
                return Some(at);
            }
            if *lost.borrow_and_update() {
                return None;
            }
            tokio::select! {
                changed = rx.changed() => changed.ok()?,
                changed = lost.changed() => changed.ok()?,
            }
        }
    }

    /// The holds let go of whose release's outcome is open (see `Shared::letting_go`).
    pub(crate) fn letting_go(&self) -> std::sync::MutexGuard<'_, HashMap<LockRef, Revision>> {
        self.shared
            .letting_go
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn http(&self) -> &Http {
        &self.shared.http
    }

    /// Completes once a keepalive reported the hold granted at `grant_rev` forced.
    pub(crate) async fn forced(&self, grant_rev: Revision) {
        let mut rx = self.shared.forced.subscribe();
        if rx.wait_for(|f| f.contains_key(&grant_rev)).await.is_err() {
            // The session is gone, and this signal with it: wait on the session's loss.
            std::future::pending::<()>().await;
        }
    }

    /// The request that force-released the hold granted at `grant_rev`, if a keepalive
    /// reported one.
    pub(crate) fn forced_by(&self, grant_rev: Revision) -> Option<String> {
        self.shared.forced.borrow().get(&grant_rev).cloned()
    }

    /// Acquires `ns/class/key` in `mode`, waiting (long-poll) up to `wait`. A 503
    /// `quorum-lost` is sent again with backoff within `wait` (see [`Client::acquire`]).
    ///
    /// # Errors
    ///
    /// [`ProblemKind::DeadlineExceeded`](crate::ProblemKind::DeadlineExceeded), [`ProblemKind::Forbidden`](crate::ProblemKind::Forbidden),
    /// [`ProblemKind::InvalidInput`](crate::ProblemKind::InvalidInput), [`ProblemKind::SessionLost`](crate::ProblemKind::SessionLost)...
    pub async fn acquire(
        &self,
        ns: &str,
        class: &str,
        key: &str,
        mode: Mode,
        wait: Duration,
    ) -> Result<RemoteHold, ClientError> {
        self.acquire_with_meta(ns, class, key, mode, wait, None)
            .await
    }

    /// [`acquire`](ClientSession::acquire), with `holder_meta` stored with the hold
    /// (the service's status lists it for each holder).
    ///
    /// # Errors
    ///
    /// As [`acquire`](ClientSession::acquire).
    pub async fn acquire_with_meta(
        &self,
        ns: &str,
        class: &str,
        key: &str,
        mode: Mode,
        wait: Duration,
        holder_meta: Option<&palisade_api::HolderMeta>,
    ) -> Result<RemoteHold, ClientError> {
        let lock: LockRef = (ns.to_owned(), class.to_owned(), key.to_owned());
        let replaces = self.letting_go().get(&lock).copied();
        let body = AcquireBody {
            session: self.shared.id.clone(),
            namespace: ns.to_owned(),
            class: class.to_owned(),
            key: key.to_owned(),
            mode,
            wait_ms: millis(wait),
            holder_meta: holder_meta.map(|m| m.as_map().clone()),
            attempt: Some(AttemptId::random()),
            replaces,
        };
        let g = acquire(&self.shared.http, body).await?;
        if replaces.is_some() {
            // Granted: the hold it named is gone.
            self.letting_go().remove(&lock);
        }
        Ok(RemoteHold {
            session: self.clone(),
            ns: ns.to_owned(),
            class: class.to_owned(),
            key: key.to_owned(),
            mode,
            token: g.token,
            grant_rev: g.grant_rev,
            done: false,
        })
    }

    /// Closes the session: every hold of it ends.
    ///
    /// # Errors
    ///
    /// [`ClientError`] from the service (a session already gone is not an error).
    pub async fn close(self) -> Result<(), ClientError> {
        self.shared.lost.send_replace(true);
        let path = routes::session(&self.shared.id);
        match self.shared.http.send_empty("DELETE", &path, None).await {
            Err(e) if !e.is_session_lost() => Err(e),
            _ => Ok(()),
        }
    }
}

/// Sends the acquire in `body`, again while the service is unavailable and its wait
/// leaves time (each time with the time left as its `wait_ms`).
/// How long after the wait's end an acquire whose answer was lost is still sent again:
/// enough for a few tries that find the hold granted, or withdraw the waiter.
const LOST_ANSWER_GRACE: Duration = Duration::from_secs(5);

/// Sends an acquire, as one attempt (`body.attempt`, picked here if unset), until it
/// gets a definite answer. A 503 that passes is sent again as
/// [`retry_within`](crate::unavailable::retry_within) says. A transport failure (a
/// reset connection, no answer) leaves the outcome open: the acquire may be waiting or
/// granted on the service. It is sent again as the same attempt, after a pause (50 ms
/// doubling up to 1 s), with the time left of the wait (0 once it is over: try once),
/// until [`LOST_ANSWER_GRACE`] after the wait's end: the retry gets the hold the
/// attempt was granted, or takes over its place in the queue (the service's rule for a
/// retried attempt), never a second hold. A failure to connect sent nothing and is
/// returned as it is.
async fn acquire(http: &Http, mut body: AcquireBody) -> Result<HoldView, ClientError> {
    body.attempt.get_or_insert_with(AttemptId::random);
    let deadline = Instant::now() + Duration::from_millis(body.wait_ms);
    let give_up = deadline + LOST_ANSWER_GRACE;
    let mut pause = Duration::from_millis(50);
    loop {
        let result = crate::unavailable::retry_within(deadline, |left| {
            body.wait_ms = millis(left);
            let body = json(&body);
            async move { http.send("POST", routes::ACQUIRE, Some(body)).await }
        })
        .await;
        match result {
            // A failure to connect sent nothing: said as it is (with the 503 it follows).
            Err(e)
                if e.kind() == &ClientErrorKind::Transport
                    && !e.is_connect_failure()
                    && Instant::now() + pause < give_up =>
            {
                tracing::debug!(error = %e, attempt = ?body.attempt, "acquire's answer lost; sending the attempt again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// A duration in whole milliseconds, as the wire's `*_ms` fields (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A body as JSON; the wire types always serialize.
fn json(body: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(body).unwrap_or_default()
}
