//! A durable high-water store on PostgreSQL, shared by every replica of a service.

use std::sync::Arc;

use moka::sync::Cache;
use tokio_postgres::Client;

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::postgres::{is_retryable, raise};
use crate::FencingToken;

/// High-water marks in the `fence_high_water` table (create it with
/// [`migrate`](crate::migrate)).
///
/// Every raise is one statement, `INSERT … ON CONFLICT (resource) DO UPDATE SET token =
/// EXCLUDED.token … WHERE fence_high_water.token <= EXCLUDED.token RETURNING token`, in
/// its own transaction: atomic per resource across every process that shares the
/// database. Concurrent raises share the one connection (tokio-postgres pipelines them).
/// If that connection closes, every raise fails with a retryable [`StoreError`] (the
/// layer answers 503 on fenced resources); the store does not reconnect by itself, so
/// build a new one on a new client.
///
/// # Reject cache
///
/// [`with_reject_cache`](Self::with_reject_cache) keeps, per resource, the highest mark
/// this process has seen. Marks only rise, so a token below it is refused without a
/// round trip. An admit always goes to Postgres. (If an operator lowers or deletes rows
/// by hand, the cache keeps refusing until the process restarts.)
#[derive(Clone)]
pub struct PostgresStore {
    client: Arc<Client>,
    seen: Option<Cache<String, u64>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("reject_cache", &self.seen.as_ref().and_then(|c| c.policy().max_capacity()))
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A store on `client`'s database, without a reject cache.
    pub fn new(client: Arc<Client>) -> Self {
        PostgresStore { client, seen: None }
    }

    /// Refuses tokens below a mark seen before without a round trip, remembering up to
    /// `capacity` resources.
    #[must_use]
    pub fn with_reject_cache(mut self, capacity: u64) -> Self {
        self.seen = Some(Cache::new(capacity));
        self
    }

    /// The raise as an `async fn`.
    ///
    /// # Errors
    ///
    /// The database error, as a [`StoreError`] (retryable for SQLSTATE `40001`/`40P01`).
    pub async fn raise_async(&self, resource: &str, token: FencingToken) -> Result<Raise, StoreError> {
        if let Some(seen) = &self.seen {
            if let Some(highest) = seen.get(resource) {
                if token.get() < highest {
                    return Ok(Raise::Stale { highest: FencingToken::from_u64(highest).unwrap_or(FencingToken::MAX) });
                }
            }
        }
        let outcome = raise(&*self.client, resource, token).await.map_err(|e| {
            let retryable = is_retryable(&e) || e.is_closed();
            StoreError::new(e, retryable)
        })?;
        if let Some(seen) = &self.seen {
            let mark = match outcome {
                Raise::Admitted => token,
                Raise::Stale { highest } => highest,
            };
            seen.entry_by_ref(resource).and_upsert_with(|e| e.map_or(mark.get(), |e| (*e.value()).max(mark.get())));
        }
        Ok(outcome)
    }
}

impl HighWaterStore for PostgresStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        let store = self.clone();
        let resource = resource.to_owned();
        Box::pin(async move { store.raise_async(&resource, token).await })
    }
}
