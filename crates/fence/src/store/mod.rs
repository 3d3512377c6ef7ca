//! High-water stores: where a resource's highest admitted token is kept.
//!
//! Every store implements one operation, [`HighWaterStore::raise`]: *atomically*, if the
//! token is at least the resource's current mark, raise the mark to it and admit;
//! otherwise leave the mark alone and report it. Marks only ever rise. An equal token is
//! admitted (a holder may write many times under one hold).
//!
//! | store | scope | durability | where the atomicity comes from |
//! |---|---|---|---|
//! | [`MemoryStore`] (feature `memory`) | one process | lost on restart | the resource's shard lock, plus an eviction floor |
//! | [`PostgresStore`] (feature `postgres`) | all replicas sharing a database | durable | `fence_raise`: the resource's advisory lock, then `UPDATE … WHERE token <= $token` (or, for a resource's first, `INSERT … ON CONFLICT … DO UPDATE … WHERE`) only for a newer token; concurrent raises batched into one statement |
//! | [`RedisStore`] (feature `redis`) | all replicas sharing a Redis | as Redis's persistence and replication keep it (see docs/resources.md) | `fence_raise` of the `palisade_fence` Redis Function library: read, compare and raise in one function call, which Redis runs alone |
//! | [`MysqlStore`] (feature `mysql`) | all replicas sharing a MySQL/MariaDB database | durable (InnoDB), as its replication keeps it | `fence_raise`: an upsert of the resource's row, then a locking read of it; a lower token signals `45000` |

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;

use crate::FencingToken;

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "memory")]
pub use memory::MemoryStore;
#[cfg(feature = "mysql")]
pub use mysql::MysqlStore;
#[cfg(feature = "postgres")]
pub use postgres::{BatchCounts, PostgresStore};
#[cfg(feature = "redis")]
pub use redis::RedisStore;

/// The future returned by [`HighWaterStore::raise`].
pub type RaiseFuture = Pin<Box<dyn Future<Output = Result<Raise, StoreError>> + Send + 'static>>;

/// A store of per-resource high-water marks with an atomic compare-and-raise.
///
/// Implementations must be linearizable per resource: if two raises of one resource are
/// admitted, the one that took effect later has the larger (or equal) token, and a raise
/// never admits a token below a mark that an earlier completed raise left behind.
pub trait HighWaterStore: Send + Sync + 'static {
    /// Raises `resource`'s mark to `token` if `token >= mark`, else reports the mark.
    ///
    /// A resource never seen has no mark (any token is admitted), unless the store keeps
    /// a floor for resources it forgot (see [`MemoryStore`]).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot answer (for example the database is down).
    /// Nothing was decided then: the caller must not treat it as an admit.
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture;

    /// Decides the raise at once if this store can without waiting (an in-process store
    /// such as [`MemoryStore`]); `None` means "call [`raise`](Self::raise)". The answer
    /// must be exactly what `raise` would give: callers use it to skip the boxed future
    /// (the [`FenceLayer`](crate::FenceLayer) does).
    ///
    /// The default returns `None`.
    ///
    /// # Errors
    ///
    /// As [`raise`](Self::raise), inside the `Some`.
    fn raise_ready(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Option<Result<Raise, StoreError>> {
        let _ = (resource, token);
        None
    }
}

impl<T: HighWaterStore + ?Sized> HighWaterStore for std::sync::Arc<T> {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        (**self).raise(resource, token)
    }

    fn raise_ready(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Option<Result<Raise, StoreError>> {
        (**self).raise_ready(resource, token)
    }
}

/// The outcome of [`HighWaterStore::raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raise {
    /// The token was at least the mark; the mark is now the token.
    Admitted,
    /// The token was below the mark, which is unchanged.
    Stale {
        /// The resource's mark: the highest token it has admitted (or its floor).
        highest: FencingToken,
    },
}

impl Raise {
    /// Whether the token was admitted.
    pub fn is_admitted(self) -> bool {
        matches!(self, Raise::Admitted)
    }
}

/// A store could not answer a raise.
#[derive(Debug, thiserror::Error)]
#[error("high-water store unavailable")]
pub struct StoreError {
    retryable: bool,
    #[source]
    source: Box<dyn StdError + Send + Sync>,
}

impl StoreError {
    /// Wraps the store's own error.
    pub fn new(source: impl Into<Box<dyn StdError + Send + Sync>>, retryable: bool) -> Self {
        StoreError {
            retryable,
            source: source.into(),
        }
    }

    /// Whether trying again may succeed (a transient failure, not a misconfiguration).
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}
