//! A durable high-water store on PostgreSQL, shared by every replica of a service.

use std::sync::{Arc, OnceLock};

use moka::sync::Cache;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::postgres::is_retryable;
use crate::FencingToken;

/// The store's compare-and-raise: the helper's `fence_raise` (see
/// [`crate::postgres`]), in a transaction of its own. A token equal to the mark (a holder
/// writing again) or below it is decided by a read under the resource's shared lock, with
/// no write, no WAL and no commit flush; only a newer token takes the lock exclusive and
/// writes, and so waits for the fenced transactions in flight on that resource.
const RAISE: &str = "SELECT fence_raise($1, $2)";

/// Decides a raise with [`RAISE`], prepared once per store (the store owns its
/// connection); one round trip.
async fn raise_once(
    client: &Client,
    prepared: &OnceLock<Statement>,
    resource: &str,
    token: FencingToken,
) -> Result<Raise, tokio_postgres::Error> {
    let statement = match prepared.get() {
        Some(s) => s.clone(),
        None => {
            // Concurrent first raises may each prepare; one statement is kept.
            let s = client
                .prepare_typed(RAISE, &[Type::TEXT, Type::INT8])
                .await?;
            prepared.get_or_init(|| s).clone()
        }
    };
    let row = client.query_one(&statement, &[&resource, &token]).await?;
    Ok(crate::postgres::verdict(token, row.try_get(0)?))
}

/// High-water marks in the `fence_high_water` table (create it and the raise functions
/// with [`migrate`](crate::migrate)).
///
/// Every raise is one statement in its own transaction, `SELECT fence_raise(resource,
/// token)`, the raise of the [Postgres helper](crate::postgres): it reads the resource's
/// mark and, only if the token is above it, takes the resource's lock exclusive and
/// upserts the row: atomic per resource across every process that shares the database.
/// A token equal to the mark (a holder writing again under one hold) is admitted by a
/// read under the shared lock, so it costs no write, no WAL and no commit flush; only a
/// newer token writes. Create the function with [`migrate`](crate::migrate). Concurrent raises
/// share the one connection (tokio-postgres pipelines them), and so one database
/// backend: writes of newer tokens are committed one after another.
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
    raise: Arc<OnceLock<Statement>>,
    seen: Option<Cache<String, u64>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field(
                "reject_cache",
                &self.seen.as_ref().and_then(|c| c.policy().max_capacity()),
            )
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A store on `client`'s database, without a reject cache.
    pub fn new(client: Arc<Client>) -> Self {
        PostgresStore {
            client,
            raise: Arc::default(),
            seen: None,
        }
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
    pub async fn raise_async(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Result<Raise, StoreError> {
        if let Some(seen) = &self.seen {
            if let Some(highest) = seen.get(resource) {
                if token.get() < highest {
                    return Ok(Raise::Stale {
                        highest: FencingToken::from_u64(highest).unwrap_or(FencingToken::MAX),
                    });
                }
            }
        }
        let outcome = raise_once(&self.client, &self.raise, resource, token)
            .await
            .map_err(|e| {
                let retryable = is_retryable(&e) || e.is_closed();
                StoreError::new(e, retryable)
            })?;
        if let Some(seen) = &self.seen {
            let mark = match outcome {
                Raise::Admitted => token,
                Raise::Stale { highest } => highest,
            };
            seen.entry_by_ref(resource)
                .and_upsert_with(|e| e.map_or(mark.get(), |e| (*e.value()).max(mark.get())));
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
