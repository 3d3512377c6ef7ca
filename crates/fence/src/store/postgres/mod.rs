//! A durable high-water store on PostgreSQL, shared by every replica of a service.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use moka::sync::Cache;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::postgres::{read_mark, reset_mark, FenceError, Mark};
use crate::FencingToken;

mod batch;

use batch::{dispatch, Batcher, Pending, Source};

/// How many raises one round trip carries at most, by default.
const DEFAULT_MAX_BATCH: usize = 256;

/// High-water marks in the `fence_high_water` table (create it and the raise functions
/// with [`migrate`](crate::migrate)), decided in batches over a pool of connections.
///
/// # How a raise is decided
///
/// Every raise is an autocommit statement that reads the resource's committed mark. A
/// token below it is refused, a token equal to it (a holder writing again under one
/// hold) admitted, by that read alone: no lock, no write, no WAL, no commit flush. A newer
/// token, or a resource's first, goes through `fence_raise`, the raise of the
/// [Postgres helper](crate::postgres): it takes the resource's lock exclusive (so it
/// waits for the fenced transactions in flight) and upserts the row only if the token is
/// still at least the mark: atomic per resource across every process that shares the
/// database. The read needs no lock because the store's raise is its own transaction and
/// holds nothing while the request runs: an equal token admitted while a newer raise is
/// still uncommitted is simply ordered before it, and a raise that completed is seen by
/// every statement that starts after it.
///
/// Raises are queued to one task per store, which sends them in batches: while every
/// connection is busy, the raises that arrive wait, and the next free connection takes
/// all of them (up to [`with_max_batch`](Self::with_max_batch)) in **one round trip**:
/// one call of `palisade_fence.fence_decide_many` over arrays, which reads every mark
/// and calls `fence_raise` for the newer tokens in the order of their lock keys, so two
/// batches never deadlock.
/// Each request gets its own verdict. Raises of one
/// resource in one batch are decided together: the highest token is raised, an equal
/// token gets its verdict, and a lower one is refused with the mark that raise left (as
/// if it had arrived just after it; they were in flight at the same time).
///
/// A resource name with a NUL byte, which Postgres `text` cannot hold, is kept with
/// U+FFFD in its place (it shares a mark with the name spelled so).
///
/// # Behind a connection pooler
///
/// Every statement is unnamed (parse, bind and execute in one message) and is its own
/// transaction, so the store keeps no session state on the server: it runs behind a
/// transaction-mode pooler (PgBouncer's `pool_mode = transaction`) as it does directly.
/// (The plans `fence_decide_many` keeps belong to whichever server connection runs it;
/// each one plans on its first call.)
///
/// On connections that keep their session (direct, or a session-mode pool),
/// [`with_prepared_statements`](Self::with_prepared_statements) sends each batch as a
/// named statement prepared once per connection, which saves the server a parse and a
/// plan per batch.
///
/// # Connections
///
/// [`from_pool`](Self::from_pool) takes a `deadpool_postgres::Pool`: as many batches in
/// flight as the pool has connections, and a closed connection is replaced by the pool.
/// [`new`](Self::new) takes one client: one batch in flight; if that connection closes,
/// every raise fails with a retryable [`StoreError`] (the layer answers 503 on fenced
/// resources) until the store is rebuilt on a new client.
///
/// The queue task is started by the first raise, on that caller's tokio runtime, and
/// ends when the last clone of the store is dropped. [`raise`](HighWaterStore::raise)
/// queues the raise when it is called, not when its future is first polled: a future
/// dropped unanswered may still have raised the mark (a mark raised without a write
/// refuses only tokens below one that a holder was granted).
///
/// # Reject cache
///
/// [`with_reject_cache`](Self::with_reject_cache) keeps, per resource, the highest mark
/// this process has seen. Marks only rise, so a token below it is refused without a
/// round trip. An admit always goes to Postgres. (If an operator lowers a mark, the
/// cache keeps refusing until the process restarts; see [`crate::postgres`] on resets.)
#[derive(Clone)]
pub struct PostgresStore {
    shared: Arc<Shared>,
    seen: Option<Cache<String, u64>>,
}

struct Shared {
    batcher: Arc<Batcher>,
    queue: OnceLock<mpsc::UnboundedSender<Pending>>,
}

/// How a [`PostgresStore`] has batched its raises: counts since the store was built,
/// shared by its clones. `raises / batches` is the mean batch size; a mean near 1 under
/// load means every raise pays a round trip and a statement of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchCounts {
    /// Batches sent to the database (one statement and one round trip each, failed ones
    /// included).
    pub batches: u64,
    /// Raises those batches carried (the reject cache's refusals, which send nothing,
    /// are not counted).
    pub raises: u64,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("connections", &self.shared.batcher.source.connections())
            .field("max_batch", &self.shared.batcher.max_batch)
            .field("prepared_statements", &self.shared.batcher.prepared)
            .field(
                "reject_cache",
                &self.seen.as_ref().and_then(|c| c.policy().max_capacity()),
            )
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A store on `client`'s database (one batch in flight), without a reject cache.
    pub fn new(client: Arc<Client>) -> Self {
        PostgresStore::with_source(Source::Client(client))
    }

    /// A store on `pool`'s database: up to the pool's size batches in flight, without a
    /// reject cache.
    pub fn from_pool(pool: deadpool_postgres::Pool) -> Self {
        PostgresStore::with_source(Source::Pool(pool))
    }

    fn with_source(source: Source) -> Self {
        PostgresStore {
            shared: Arc::new(Shared::new(source, DEFAULT_MAX_BATCH, false)),
            seen: None,
        }
    }

    /// Sends at most `max` raises in one round trip (default 256; at least 1). Set it
    /// before the first raise: it makes a new store (clones made before keep theirs).
    #[must_use]
    pub fn with_max_batch(self, max: usize) -> Self {
        let batcher = &self.shared.batcher;
        PostgresStore {
            shared: Arc::new(Shared::new(
                batcher.source.clone(),
                max.max(1),
                batcher.prepared,
            )),
            seen: self.seen,
        }
    }

    /// Sends each batch as a named statement, prepared once per connection (on its first
    /// batch), instead of an unnamed one: the server skips a parse and a plan per batch.
    /// Set it before the first raise: it makes a new store (clones made before keep
    /// theirs).
    ///
    /// **Needs a session**: connections straight to Postgres, or through a session-mode
    /// pool, never a transaction-mode pooler (PgBouncer's `pool_mode = transaction`),
    /// where the next batch may run on a server connection that lacks the statement, or
    /// holds another client's statement under the same name. Misconfigured, a batch
    /// fails with a [`StoreError`] that is not retryable, and no verdict is taken from
    /// it: the statement missing (SQLSTATE `26000`) or its name taken (`42P05`), as the
    /// helper's [`NeedsSession`](crate::FenceErrorKind::NeedsSession), or an answer
    /// that lacks the signature the store's statements add as a second column (another
    /// statement ran under the store's name) are named as such; another statement that
    /// the server cannot bind the store's parameters to fails as a database error.
    #[must_use]
    pub fn with_prepared_statements(self) -> Self {
        let batcher = &self.shared.batcher;
        PostgresStore {
            shared: Arc::new(Shared::new(batcher.source.clone(), batcher.max_batch, true)),
            seen: self.seen,
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
    /// The database error, as a [`StoreError`] (retryable for SQLSTATE `40001`/`40P01`
    /// and a closed connection or an exhausted pool).
    ///
    /// # Panics
    ///
    /// The first raise of a store panics outside a tokio runtime (it starts the queue
    /// task there).
    pub async fn raise_async(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Result<Raise, StoreError> {
        match self.enqueue(resource, token) {
            Queued::Decided(outcome) => outcome,
            Queued::Waiting(answer) => self.answered(resource, token, answer.await),
        }
    }

    /// Decides the raise from the reject cache, or queues it for a batch.
    fn enqueue(&self, resource: &str, token: FencingToken) -> Queued {
        if let Some(seen) = &self.seen {
            if let Some(highest) = seen.get(resource) {
                if token.get() < highest {
                    return Queued::Decided(Ok(Raise::Stale {
                        highest: FencingToken::from_u64(highest).unwrap_or(FencingToken::MAX),
                    }));
                }
            }
        }
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            resource: stored(resource).into_owned(),
            token,
            reply,
        };
        if self.queue().send(pending).is_err() {
            return Queued::Decided(Err(StoreError::new(
                "the store's queue task has stopped",
                true,
            )));
        }
        Queued::Waiting(answer)
    }

    /// The verdict a batch sent back, remembered in the reject cache.
    fn answered(
        &self,
        resource: &str,
        token: FencingToken,
        answer: Result<Result<Raise, StoreError>, oneshot::error::RecvError>,
    ) -> Result<Raise, StoreError> {
        let outcome = answer.map_err(dropped)??;
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

    /// Reads `resource`'s mark from the database (not from the reject cache); `None` when
    /// it has none. See [`read_mark`](crate::postgres::read_mark).
    ///
    /// # Errors
    ///
    /// The database error, or kind [`Closed`](crate::FenceErrorKind::Closed) when no
    /// connection could be had.
    pub async fn mark(&self, resource: &str) -> Result<Option<Mark>, FenceError> {
        match &self.shared.batcher.source {
            Source::Client(client) => read_mark(&**client, &stored(resource)).await,
            Source::Pool(pool) => {
                let client = pool
                    .get()
                    .await
                    .map_err(|e| FenceError::no_connection(e.to_string().into()))?;
                read_mark(&**client, &stored(resource)).await
            }
        }
    }

    /// Lowers `resource`'s mark to `to` for `reason` and forgets it in this store's reject
    /// cache; returns the mark it replaced. See [`reset_mark`](crate::postgres::reset_mark)
    /// for the rules that keep a reset from re-admitting a stale writer.
    ///
    /// # Errors
    ///
    /// As [`reset_mark`](crate::postgres::reset_mark), or kind
    /// [`Closed`](crate::FenceErrorKind::Closed) when no connection could be had.
    pub async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
    ) -> Result<FencingToken, FenceError> {
        let resource_text = stored(resource);
        let old = match &self.shared.batcher.source {
            Source::Client(client) => reset_mark(&**client, &resource_text, to, reason).await?,
            Source::Pool(pool) => {
                let client = pool
                    .get()
                    .await
                    .map_err(|e| FenceError::no_connection(e.to_string().into()))?;
                reset_mark(&**client, &resource_text, to, reason).await?
            }
        };
        if let Some(seen) = &self.seen {
            seen.invalidate(resource);
        }
        Ok(old)
    }

    /// The batches sent so far and the raises they carried.
    pub fn batch_counts(&self) -> BatchCounts {
        BatchCounts {
            batches: self.shared.batcher.counts.batches.load(Ordering::Relaxed),
            raises: self.shared.batcher.counts.raises.load(Ordering::Relaxed),
        }
    }

    fn queue(&self) -> &mpsc::UnboundedSender<Pending> {
        self.shared.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(dispatch(Arc::clone(&self.shared.batcher), rx));
            tx
        })
    }
}

impl Shared {
    fn new(source: Source, max_batch: usize, prepared: bool) -> Self {
        Shared {
            batcher: Arc::new(Batcher::new(source, max_batch, prepared)),
            queue: OnceLock::new(),
        }
    }
}

impl HighWaterStore for PostgresStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        // Queued now; the future holds only the answer (and, with a reject cache, what
        // it needs to remember the verdict).
        match (self.enqueue(resource, token), &self.seen) {
            (Queued::Decided(outcome), _) => Box::pin(std::future::ready(outcome)),
            (Queued::Waiting(answer), None) => {
                Box::pin(async move { answer.await.map_err(dropped)? })
            }
            (Queued::Waiting(answer), Some(_)) => {
                let (store, resource) = (self.clone(), resource.to_owned());
                Box::pin(async move { store.answered(&resource, token, answer.await) })
            }
        }
    }
}

/// The error of a raise whose batch never answered (the queue task ended first).
fn dropped(_: oneshot::error::RecvError) -> StoreError {
    StoreError::new("the store's queue task dropped a raise", true)
}

/// A raise decided at once (by the reject cache, or a stopped queue), or waiting for its
/// batch.
enum Queued {
    Decided(Result<Raise, StoreError>),
    Waiting(oneshot::Receiver<Result<Raise, StoreError>>),
}

/// `resource` as the store keeps it: Postgres `text` holds no NUL byte, so each becomes
/// U+FFFD (as [`decoded_path`](crate::decoded_path) turns invalid UTF-8). Names that
/// differ only there share one mark, which refuses more, never less.
fn stored(resource: &str) -> Cow<'_, str> {
    if resource.contains('\0') {
        Cow::Owned(resource.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(resource)
    }
}
