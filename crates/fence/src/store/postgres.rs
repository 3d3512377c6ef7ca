//! A durable high-water store on PostgreSQL, shared by every replica of a service.

use std::sync::{Arc, OnceLock};

use moka::sync::Cache;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::postgres::is_retryable;
use crate::FencingToken;

/// The store's compare-and-raise, one statement. It reads the mark first and writes only
/// when the token is above it: a token equal to the mark (a holder writing again) or
/// below it is decided by the read alone, with no row lock, no WAL and no commit flush.
/// `raised` is 1 when the upsert wrote; `seen` is the mark the read found.
const RAISE_IF_NEWER: &str = "WITH cur AS (SELECT token FROM fence_high_water WHERE resource = $1), \
     up AS (INSERT INTO fence_high_water (resource, token, updated_at) \
       SELECT $1, $2, now() WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.token >= $2) \
       ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now() \
       WHERE fence_high_water.token <= EXCLUDED.token RETURNING token) \
     SELECT (SELECT count(*) FROM up) AS raised, (SELECT token FROM cur) AS seen";
const MARK: &str = "SELECT token FROM fence_high_water WHERE resource = $1";

/// Decides a raise with [`RAISE_IF_NEWER`], prepared once per store (the store owns its
/// connection); one round trip, two when a concurrent raise overtook this one (then the
/// mark is read again to name it).
async fn raise_if_newer(
    client: &Client,
    prepared: &OnceLock<Statement>,
    resource: &str,
    token: FencingToken,
) -> Result<Raise, tokio_postgres::Error> {
    let statement = match prepared.get() {
        Some(s) => s.clone(),
        None => {
            // Concurrent first raises may each prepare; one statement is kept.
            let s = client.prepare_typed(RAISE_IF_NEWER, &[Type::TEXT, Type::INT8]).await?;
            prepared.get_or_init(|| s).clone()
        }
    };
    let row = client.query_one(&statement, &[&resource, &token]).await?;
    let raised: i64 = row.try_get(0)?;
    let seen: Option<FencingToken> = row.try_get(1)?;
    if raised > 0 {
        return Ok(Raise::Admitted);
    }
    match seen {
        // Equal: admitted at the read, which saw the mark at exactly this token.
        Some(seen) if seen == token => Ok(Raise::Admitted),
        Some(seen) if seen > token => Ok(Raise::Stale { highest: seen }),
        // The upsert ran but refused: a concurrent raise above this token committed
        // after the read. Name the mark it left.
        _ => {
            let row = client.query_typed_opt(MARK, &[(&resource, Type::TEXT)]).await?;
            let highest = row.map(|r| r.get::<_, FencingToken>(0)).unwrap_or(token);
            Ok(Raise::Stale { highest })
        }
    }
}

/// High-water marks in the `fence_high_water` table (create it with
/// [`migrate`](crate::migrate)).
///
/// Every raise is one statement in its own transaction: it reads the resource's mark and,
/// only if the token is above it, upserts (`INSERT … ON CONFLICT (resource) DO UPDATE SET
/// token = EXCLUDED.token … WHERE fence_high_water.token <= EXCLUDED.token`): atomic per
/// resource across every process that shares the database. A token equal to the mark
/// (a holder writing again under one hold) is admitted by the read alone, so it costs no
/// row lock, no WAL and no commit flush; only a newer token writes. Concurrent raises
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
            .field("reject_cache", &self.seen.as_ref().and_then(|c| c.policy().max_capacity()))
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A store on `client`'s database, without a reject cache.
    pub fn new(client: Arc<Client>) -> Self {
        PostgresStore { client, raise: Arc::default(), seen: None }
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
        let outcome = raise_if_newer(&self.client, &self.raise, resource, token).await.map_err(|e| {
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
