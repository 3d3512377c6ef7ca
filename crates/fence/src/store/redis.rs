//! A durable high-water store on Redis, shared by every replica of a service.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::mark::{Mark, MarkReset, ResetGuard};
use crate::redis::{KeyLayout, RedisFence, RedisFenceError};
use crate::FencingToken;

/// High-water marks in Redis, decided by the `palisade_fence` library's `fence_raise`
/// (see [`crate::redis`]): one atomic call per raise, so raises of one resource are
/// linearizable across every process that shares the Redis (a Redis script runs alone).
///
/// The mark of resource `r` is the hash `<prefix>{r}:mark` ([`KeyLayout`]; default prefix
/// `palisade:fence:`), the same key the fenced writes of [`RedisFence`] use: a service may
/// fence its HTTP writes with this store behind [`FenceLayer`](crate::FenceLayer) and its
/// direct Redis writes with the fenced functions, against one mark.
///
/// # Fails closed
///
/// When Redis does not answer (the connection is down or times out, the server is
/// loading or read-only, `NOREPLICAS` under `min-replicas-to-write`), a raise fails with a
/// retryable [`StoreError`]: the layer answers 503 on fenced resources, never an admit.
/// The `ConnectionManager` reconnects in the background. A raise that timed out may still
/// have raised the mark (a mark raised without a write refuses only tokens below one a
/// holder was granted).
///
/// # Durability
///
/// Redis replicates asynchronously and, by default, does not fsync each write: a crash
/// or a failover can lose the newest marks, and a lost mark re-admits the tokens below
/// it. docs/resources.md ("Redis") says which settings close that (`appendfsync always`,
/// `WAIT`, `min-replicas-to-write`), which eviction policies are unsafe, and why marks
/// carry no TTL.
///
/// # The library
///
/// The first raise loads the library ([`RedisFence::load`]: `FUNCTION LOAD REPLACE` when
/// the server lacks this version, or the `EVALSHA` fallback on Redis before 7), unless
/// the store was built [`with_fence`](Self::with_fence). Until that succeeds, raises fail
/// with a retryable [`StoreError`].
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    layout: KeyLayout,
    fence: Arc<OnceCell<RedisFence>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.layout.prefix())
            .field("dispatch", &self.fence.get().map(RedisFence::dispatch))
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// How many times [`connect`](Self::connect)'s connection manager tries to reconnect
    /// before a request fails (each attempt at most [`CONNECT_TIMEOUT`](Self::CONNECT_TIMEOUT)).
    pub const RECONNECT_ATTEMPTS: usize = 2;
    /// [`connect`](Self::connect)'s limit on one connection attempt.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    /// [`connect`](Self::connect)'s limit on waiting for one reply.
    pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

    /// A store on `conn`'s Redis under the default [`KeyLayout`]; the library is loaded
    /// by the first raise. `conn` may be lazy (`ConnectionManager::new_lazy_with_config`):
    /// nothing is sent until then.
    pub fn new(conn: ConnectionManager) -> Self {
        RedisStore {
            conn,
            layout: KeyLayout::default(),
            fence: Arc::new(OnceCell::new()),
        }
    }

    /// A store that calls the library through `fence` (already loaded, or the `EVALSHA`
    /// fallback of [`RedisFence::eval`]), under `fence`'s layout.
    pub fn with_fence(conn: ConnectionManager, fence: RedisFence) -> Self {
        RedisStore {
            conn,
            layout: fence.layout().clone(),
            fence: Arc::new(OnceCell::new_with(Some(fence))),
        }
    }

    /// Connects to `url` (`redis://[user:password@]host:port[/db]`, `rediss://` is not
    /// built in) with a connection manager that tries [`RECONNECT_ATTEMPTS`](Self::RECONNECT_ATTEMPTS)
    /// times and waits at most [`RESPONSE_TIMEOUT`](Self::RESPONSE_TIMEOUT) for a reply, and
    /// loads the library.
    ///
    /// # Errors
    ///
    /// [`Unavailable`](crate::redis::RedisFenceErrorKind::Unavailable) when Redis does
    /// not answer; [`Redis`](crate::redis::RedisFenceErrorKind::Redis) for a bad URL or a
    /// refusal; [`Library`](crate::redis::RedisFenceErrorKind::Library) as
    /// [`load_library`](crate::redis::load_library).
    pub async fn connect(url: &str) -> Result<Self, RedisFenceError> {
        let client = redis::Client::open(url).map_err(|e| RedisFenceError::from_redis("", e))?;
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(Self::RECONNECT_ATTEMPTS)
            .set_connection_timeout(Some(Self::CONNECT_TIMEOUT))
            .set_response_timeout(Some(Self::RESPONSE_TIMEOUT));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| RedisFenceError::from_redis("", e))?;
        let store = RedisStore::new(conn);
        store.fence().await?;
        Ok(store)
    }

    /// Keeps the marks under `layout` (a prefix of its own per application or tenant).
    /// Set it before the first raise: it makes a new store whose library is loaded again.
    #[must_use]
    pub fn with_layout(self, layout: KeyLayout) -> Self {
        let fence = self
            .fence
            .get()
            .map(|f| f.clone().with_layout(layout.clone()));
        RedisStore {
            conn: self.conn,
            layout,
            fence: Arc::new(OnceCell::new_with(fence)),
        }
    }

    /// The store's fence (loading the library on first use): for the fenced writes, under
    /// the store's layout.
    ///
    /// # Errors
    ///
    /// As [`RedisFence::load`].
    pub async fn fence(&self) -> Result<RedisFence, RedisFenceError> {
        self.fence
            .get_or_try_init(|| async {
                let mut conn = self.conn.clone();
                Ok(RedisFence::load(&mut conn)
                    .await?
                    .with_layout(self.layout.clone()))
            })
            .await
            .cloned()
    }

    /// A handle on the store's connection (a clone of its manager).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The raise as an `async fn`.
    ///
    /// # Errors
    ///
    /// [`StoreError`] (its source a [`RedisFenceError`]), retryable when Redis was
    /// unavailable or the library could not be loaded for that reason.
    pub async fn raise_async(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Result<Raise, StoreError> {
        let outcome = match self.fence().await {
            Ok(fence) => fence.raise(&mut self.conn.clone(), resource, token).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(_) => Ok(Raise::Admitted),
            Err(e) => match e.highest() {
                Some(highest) => Ok(Raise::Stale { highest }),
                None => {
                    let retryable = e.is_retryable();
                    Err(StoreError::new(e, retryable))
                }
            },
        }
    }

    /// Reads `resource`'s mark; see [`read_mark`](crate::redis::read_mark).
    ///
    /// # Errors
    ///
    /// As [`read_mark`](crate::redis::read_mark), or the library's loading.
    pub async fn mark(&self, resource: &str) -> Result<Option<Mark>, RedisFenceError> {
        let fence = self.fence().await?;
        crate::redis::read_mark(&mut self.conn.clone(), &fence, resource).await
    }

    /// The last `limit` resets of `resource`, newest first; see
    /// [`read_resets`](crate::redis::read_resets).
    ///
    /// # Errors
    ///
    /// As [`read_resets`](crate::redis::read_resets).
    pub async fn resets(
        &self,
        resource: &str,
        limit: i64,
    ) -> Result<Vec<MarkReset>, RedisFenceError> {
        let fence = self.fence().await?;
        crate::redis::read_resets(&mut self.conn.clone(), &fence, resource, limit).await
    }

    /// Lowers `resource`'s mark to `to` for `reason`, checked against `guard`; returns
    /// the mark it replaced. See [`reset_mark_guarded`](crate::redis::reset_mark_guarded)
    /// for the rules.
    ///
    /// # Errors
    ///
    /// As [`reset_mark_guarded`](crate::redis::reset_mark_guarded).
    pub async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
        guard: &ResetGuard,
    ) -> Result<FencingToken, RedisFenceError> {
        let fence = self.fence().await?;
        crate::redis::reset_mark_guarded(
            &mut self.conn.clone(),
            &fence,
            resource,
            to,
            reason,
            guard,
        )
        .await
    }
}

impl HighWaterStore for RedisStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        let (store, resource) = (self.clone(), resource.to_owned());
        Box::pin(async move { store.raise_async(&resource, token).await })
    }
}
