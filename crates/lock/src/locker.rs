//! [`Locker`]: the entry point. One etcd client, one root prefix, one epoch state.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::Instant;

use crate::acquire::AcquireAttempt;
use crate::class_cache::{spawn_watch, ClassCache};
use crate::config_store::ConfigStore;
use crate::epoch::{
    advance, start, EpochState, EpochStore, DEFAULT_EPOCH_WINDOW, MAX_EPOCH_WINDOW,
};
use crate::error::{EpochMismatch, Error, ErrorKind, InvalidInput, Result};
use crate::etcd_tls::EtcdTls;
use crate::handover::Successors;
use crate::hold::Hold;
use crate::inner::LockerInner;
use crate::lock_watch::LockWatches;
use crate::name::LockName;
use crate::session::Session;
use crate::watches::Watches;
use palisade_api::keys::RootKeys;
use palisade_api::limits::ETCD_KEEPALIVE_INTERVAL;
use palisade_api::validate_key;
use palisade_api::HolderMeta;
use palisade_api::Namespace;
use palisade_api::{validate_name, LockClass, Mode, SpiffeId};
use palisade_api::{EpochReason, EpochRecord};

pub use palisade_api::keys::DEFAULT_ROOT;

/// How to reach etcd and where the key space lives.
#[derive(Debug, Clone)]
#[must_use]
pub struct LockerOptions {
    endpoints: Vec<String>,
    root: String,
    request_timeout: Duration,
    epoch_window: u64,
    tls: Option<EtcdTls>,
}

impl LockerOptions {
    /// etcd client endpoints (`http://host:port`, or `https://host:port` with
    /// [`LockerOptions::with_tls`]), root [`DEFAULT_ROOT`], request
    /// timeout 1 s, epoch reservation window [`DEFAULT_EPOCH_WINDOW`].
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        LockerOptions {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            root: DEFAULT_ROOT.to_owned(),
            request_timeout: Duration::from_secs(1),
            epoch_window: DEFAULT_EPOCH_WINDOW,
            tls: None,
        }
    }

    /// TLS to etcd (the endpoints must then be `https://`): the CA the members'
    /// certificates chain to, and the client certificate if etcd asks for one.
    pub fn with_tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The epoch reservation window W, in etcd revisions (default
    /// [`DEFAULT_EPOCH_WINDOW`], at most [`MAX_EPOCH_WINDOW`]): how far past the
    /// revisions it has seen the locker reserves grant revisions in the durable epoch
    /// record, so that grants inside the reservation cost no durable write (see
    /// [the epoch policy](crate#epochs)). The durable record is written about once per
    /// W/2 etcd revisions (every write to etcd counts, not only grants). The price: a
    /// locker that starts while etcd's revision is below the stored reservation (after
    /// a crash or restart of a busy locker, or beside running lockers sharing the
    /// record) first writes to etcd up to W times to move its revision past it; and a
    /// restore to a snapshot less than about W revisions old is made harmless rather
    /// than reported. 0 writes the record before every grant past the last one written.
    pub fn with_epoch_window(mut self, revisions: u64) -> Self {
        self.epoch_window = revisions;
        self
    }

    /// Another root prefix (a `/` is appended if missing).
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The longest one etcd request may take before it is retried (on another endpoint,
    /// within the caller's deadline). Every request also carries etcd's require-leader
    /// metadata, so a member without a leader fails it at once instead of hanging.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }
}

/// A class lookup's own budget when it has a last known class to fall back on, in
/// request timeouts (see `Locker::class`).
const CLASS_LOOKUP_TIMEOUTS: u32 = 3;

/// The lock service core on one etcd cluster. Cheap to clone.
#[derive(Clone)]
pub struct Locker {
    pub(crate) inner: Arc<LockerInner>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("keys", &self.inner.keys)
            .finish_non_exhaustive()
    }
}

impl Locker {
    /// Connects and loads the epoch: from etcd (`config/epoch`) and from `store`. An empty
    /// key space with an empty store is bootstrapped at epoch 0. A locker whose records
    /// disagree with each other or with etcd still opens, so that an operator can
    /// [`advance_epoch`](Locker::advance_epoch), but refuses every grant with
    /// [`ErrorKind::EpochMismatch`]. If etcd's revision is below the durable
    /// reservation, it first writes to etcd until it is not (see
    /// [`LockerOptions::with_epoch_window`]). Its first grant raises the reservation
    /// (one durable write).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::EpochWindowTooLarge`] (before any etcd call);
    /// [`ErrorKind::QuorumLost`] if etcd does not answer; [`ErrorKind::EpochStore`];
    /// [`ErrorKind::CorruptRecord`].
    pub async fn connect(options: LockerOptions, store: impl EpochStore) -> Result<Locker> {
        if options.epoch_window > MAX_EPOCH_WINDOW {
            return Err(Error::invalid(InvalidInput::EpochWindowTooLarge {
                window: options.epoch_window,
                max: MAX_EPOCH_WINDOW,
            }));
        }
        let connect = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(options.request_timeout)
            .with_keep_alive(ETCD_KEEPALIVE_INTERVAL, options.request_timeout);
        let connect = crate::etcd_tls::apply(options.tls.as_ref(), connect);
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(|e| Error::with_source(ErrorKind::QuorumLost, e))?;
        let keys = RootKeys::new(&options.root);
        let (current, seen) = start(&client, &keys, &store, options.request_timeout).await?;
        let epoch = Arc::new(EpochState::new(
            Box::new(store),
            options.epoch_window,
            current,
        ));
        epoch.observe(seen);
        let classes = Arc::new(ClassCache::default());
        let class_watch = spawn_watch(
            client.clone(),
            keys.config(),
            classes.clone(),
            options.request_timeout,
        );
        Ok(Locker {
            inner: Arc::new(LockerInner {
                watches: Watches::new(client.clone(), keys.epoch(), options.request_timeout),
                lock_watches: LockWatches::default(),
                successors: Successors::new(),
                kv: client.kv_client(),
                client,
                keys,
                epoch,
                request_timeout: options.request_timeout,
                classes,
                _class_watch: class_watch,
                sessions: Arc::default(),
                cleanups: Arc::default(),
            }),
        })
    }

    /// Waits, at most `within`, for the cleanups of dropped acquires to finish (each
    /// withdraws what its acquire wrote, such as a waiter key, in the background); returns
    /// whether they all did. For a process about to exit: a cleanup cut short by the exit
    /// leaves its waiter key until the session's lease ends.
    pub async fn settle(&self, within: Duration) -> bool {
        tokio::time::timeout(within, self.inner.cleanups.settled())
            .await
            .is_ok()
    }

    /// The etcd client (for tools and tests that look at the key space).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Namespaces and classes.
    pub fn config(&self) -> ConfigStore {
        ConfigStore::new(
            self.inner.client.clone(),
            self.inner.keys.clone(),
            self.inner.request_timeout,
        )
    }

    /// The current epoch record, and why grants are refused if they are.
    pub fn epoch(&self) -> (EpochRecord, Option<EpochMismatch>) {
        let c = self.inner.epoch.snapshot();
        (c.record, c.mismatch)
    }

    /// The highest grant revision this locker knows to be minted in the current epoch: its
    /// own grants, and at least the record's confirmed `highest_grant_rev` as loaded (which
    /// lags the grants by up to the reservation window). Each locker knows only its own
    /// grants.
    pub fn minted_rev(&self) -> palisade_fence::Revision {
        palisade_fence::Revision::new(self.inner.epoch.minted())
    }

    /// Opens a session: grants an etcd lease of `ttl` (whole seconds, from one to etcd's
    /// maximum lease TTL of 9,000,000,000 s), puts the lease's marker `leases/<lease>`
    /// on it (two etcd calls) and starts its keepalive. etcd may grant
    /// more than asked (its minimum lease TTL, 2 s on etcd 3.4/3.5 by default):
    /// [`Session::ttl`] reports the granted TTL, and class TTL bounds are checked
    /// against it at acquire.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadTtl`] (checked before any etcd call);
    /// [`ErrorKind::QuorumLost`] if etcd cannot grant it.
    pub async fn open_session(&self, spiffe_id: SpiffeId, ttl: Duration) -> Result<Session> {
        Session::open(
            self.inner.client.clone(),
            spiffe_id,
            ttl,
            self.inner.request_timeout,
            |lease| self.inner.keys.lease_marker(lease),
        )
        .await
    }

    /// Acquires `lock` in `mode` for `session`, waiting until `deadline` at most.
    ///
    /// `deadline` bounds the waiting only: while the lock is held by others, or its
    /// lock-delay runs. A deadline that has already passed means *try once*: the lock is
    /// granted if nothing blocks it, else the acquire fails with
    /// [`ErrorKind::DeadlineExceeded`] at once. etcd calls get their own budget of a few
    /// request timeouts, so a short deadline never cuts a call short, and a grant Txn
    /// that committed is always returned as a [`Hold`].
    ///
    /// Uncontended, this is one etcd Txn. Otherwise the session waits in the lock's
    /// queue (FIFO by the waiter key's create revision), woken only by writes to the
    /// keys of the one waiter or holder that blocks it. It is granted by a Txn whose
    /// header revision becomes the token's revision. See
    /// [the granting rules](crate#granting-rules).
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidInput`] (bad key, unknown namespace or class, TTL outside
    ///   the class bounds, key outside the class prefix, shared acquire on an exclusive
    ///   class, this session already acquiring the lock): nothing was written.
    /// - [`ErrorKind::DeadlineExceeded`]: others held the lock (or its lock-delay ran)
    ///   until the deadline; the waiter key was deleted (if etcd answers within one
    ///   request timeout; else in the background).
    /// - [`ErrorKind::QuorumLost`]: etcd could not commit within the call's budget (it
    ///   was seen failing: errors, or no answer within a request timeout) and the class
    ///   is `closed` (an `open` class returns an unprotected [`Hold`] instead).
    /// - [`ErrorKind::EpochMismatch`]: see [the epoch policy](crate#epochs).
    /// - [`ErrorKind::SessionLost`]: the session's lease is gone.
    pub async fn acquire(
        &self,
        session: &Session,
        lock: &LockName,
        mode: Mode,
        deadline: Instant,
    ) -> Result<Hold> {
        self.acquire_with_meta(session, lock, mode, deadline, None)
            .await
    }

    /// [`acquire`](Locker::acquire), with `holder_meta` stored in the hold's keys (and
    /// its waiter key while it waits) and listed by [`lock_state`](Locker::lock_state).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Locker::acquire).
    pub async fn acquire_with_meta(
        &self,
        session: &Session,
        lock: &LockName,
        mode: Mode,
        deadline: Instant,
        holder_meta: Option<&HolderMeta>,
    ) -> Result<Hold> {
        self.acquire_guarded(
            session,
            lock,
            mode,
            deadline,
            holder_meta,
            AcquireAttempt::default(),
            None,
        )
        .await
    }

    /// [`acquire_with_meta`](Locker::acquire_with_meta), with `guard` added to the
    /// acquire's first Txn (see [`TxnGuard`](crate::acquire::TxnGuard)).
    ///
    /// A guarded acquire is tried once: an attempt that failed on an epoch advanced
    /// under it returns that error, and the caller retries with a new guard. The
    /// guard's writes must be unique per attempt, because the failed attempt's cleanup
    /// may reach etcd after the retry's Txn and would delete equal writes of the retry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn acquire_guarded(
        &self,
        session: &Session,
        lock: &LockName,
        mode: Mode,
        deadline: Instant,
        holder_meta: Option<&HolderMeta>,
        attempt: AcquireAttempt,
        guard: Option<Arc<crate::acquire::TxnGuard>>,
    ) -> Result<Hold> {
        validate_name(&lock.ns)?;
        validate_name(&lock.class)?;
        validate_key(&lock.key)?;
        let class = self.class(&lock.ns, &lock.class, deadline).await?;
        class.check_key(&lock.key).map_err(Error::invalid)?;
        if mode == Mode::Shared && class.mode == Mode::Exclusive {
            return Err(Error::invalid(InvalidInput::ModeNotAllowed));
        }
        class.check_ttl(session.ttl())?;
        if self.inner.epoch.snapshot().mismatch.is_some() {
            // Refusing (a restore seen, another cluster id, or another locker advanced
            // the epoch): adopt an epoch advanced since, if the records agree on it.
            self.inner.adopt_advanced_epoch().await;
        }
        let mut stale = 0;
        loop {
            let result = crate::acquire::acquire(
                self.inner.clone(),
                session,
                lock,
                class.clone(),
                mode,
                deadline,
                holder_meta,
                attempt,
                guard.clone(),
            )
            .await;
            let retry = result.as_ref().is_err_and(|e| {
                guard.is_none() && self.retry_after_advance(e, &mut stale, deadline)
            });
            if !retry {
                return result;
            }
        }
    }

    /// Whether an acquire that failed with `e` is tried again: the epoch changed under
    /// the attempt but the locker went on with the new one (it advanced it, or adopted
    /// another locker's advance), and time is left. Bounded: each retry needs another
    /// advance, and `stale` (the retries so far) stops at three.
    pub(crate) fn retry_after_advance(
        &self,
        e: &Error,
        stale: &mut u32,
        deadline: Instant,
    ) -> bool {
        let retry = matches!(e.kind(), ErrorKind::EpochMismatch(EpochMismatch::Advanced))
            && self.inner.epoch.snapshot().mismatch.is_none()
            && *stale < 3
            && Instant::now() < deadline;
        *stale += u32::from(retry);
        retry
    }

    /// A namespace record: from the class cache while its watch on the config prefix is
    /// up (see `class_cache`), else read from etcd. For the service, which checks a
    /// namespace's quotas on every call.
    pub async fn namespace(&self, ns: &str) -> Result<Option<Arc<Namespace>>> {
        let cache = &self.inner.classes;
        if let Some(n) = cache.namespace(ns) {
            return Ok(Some(n));
        }
        let generation = cache.generation();
        let read = self.config().namespace(ns).await?.map(Arc::new);
        if let Some(n) = &read {
            cache.fill_namespace(generation, n.clone());
        }
        Ok(read)
    }

    /// The class: from the cache while its watch on the config prefix is up (see
    /// `class_cache`), else from etcd, else, if etcd cannot answer, the last class this
    /// locker read. With such a class to fall back on, etcd gets three request timeouts;
    /// without one, the later of those and `deadline` (failing sooner would only fail the
    /// acquire: an attempt sent to a member that stopped answering, while its connection
    /// stays up, costs a whole request timeout, and a retry may reach another member).
    /// The caller's deadline bounds waiting for the lock, never this lookup: an acquire
    /// that may not wait at all still reads its class.
    async fn class(&self, ns: &str, class: &str, deadline: Instant) -> Result<Arc<LockClass>> {
        let cache = &self.inner.classes;
        if let Some(c) = cache.get(ns, class) {
            return Ok(c);
        }
        let generation = cache.generation();
        let own = Instant::now() + self.inner.request_timeout * CLASS_LOOKUP_TIMEOUTS;
        let until = if deadline > own && cache.last_known(ns, class).is_none() {
            crate::config_store::Until::Callers(deadline)
        } else {
            crate::config_store::Until::Own(own)
        };
        match self.config().class_until(ns, class, until).await {
            Ok(c) => {
                let c = Arc::new(c);
                cache.fill(generation, c.clone());
                Ok(c)
            }
            Err(e) if e.is_quorum_lost() || e.kind() == &ErrorKind::DeadlineExceeded => {
                cache.last_known(ns, class).ok_or(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Starts a new epoch on the etcd cluster this locker is connected to (an operator
    /// action after a restore or a rehome). The new epoch is `max(etcd's, durable) + 1`;
    /// the durable record is written first, then etcd's. Grants resume.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::EpochExhausted`] at [`Epoch::MAX`](crate::Epoch::MAX);
    /// [`ErrorKind::QuorumLost`]; [`ErrorKind::EpochStore`].
    pub async fn advance_epoch(&self, reason: EpochReason) -> Result<EpochRecord> {
        self.advance_epoch_above(reason, palisade_fence::Epoch::ZERO)
            .await
    }

    /// [`advance_epoch`](Locker::advance_epoch) to an epoch also above `floor`: for
    /// [`Tiers`](crate::Tiers), whose epochs are one sequence across clusters (`floor`
    /// is the highest epoch any other tier used).
    ///
    /// # Errors
    ///
    /// As [`advance_epoch`](Locker::advance_epoch).
    pub async fn advance_epoch_above(
        &self,
        reason: EpochReason,
        floor: palisade_fence::Epoch,
    ) -> Result<EpochRecord> {
        let inner = &self.inner;
        advance(
            &inner.client,
            &inner.keys,
            &inner.epoch,
            inner.request_timeout,
            reason,
            floor,
        )
        .await
    }

    /// The highest epoch this locker knows to be used on its cluster: its current
    /// epoch, and the durable record's (which an advance by another replica may have
    /// raised).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::EpochStore`] if the durable record cannot be read.
    pub async fn highest_epoch(&self) -> Result<palisade_fence::Epoch> {
        let durable = self
            .inner
            .epoch
            .store()
            .load()
            .await
            .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
        let mine = self.inner.epoch.snapshot().record.epoch;
        Ok(durable.map_or(mine, |d| d.epoch.max(mine)))
    }

    /// The root key layout this locker writes under.
    pub fn keys(&self) -> &RootKeys {
        &self.inner.keys
    }

    /// The request timeout it was built with.
    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }
}
