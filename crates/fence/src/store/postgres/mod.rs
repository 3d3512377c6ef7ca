//! A durable high-water store on PostgreSQL, shared by every replica of a service.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use moka::sync::Cache;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::postgres::{is_retryable, read_mark, reset_mark, FenceError, Mark};
use crate::FencingToken;

/// One raise, in a transaction of its own: the helper's `fence_decide` (migration
/// `0006`): a token not above the committed mark is decided by the read alone (no lock,
/// no write); a newer one, or a resource's first, goes through `fence_raise` (see
/// [`crate::postgres`]), which takes the resource's lock exclusive and upserts the row.
const RAISE_ONE: &str = "SELECT fence_decide($1, $2)";
/// Many raises in one statement: `fence_decide_many`, [`RAISE_ONE`] for each element (each
/// mark read by an index lookup), the `fence_raise` calls made in the order of the
/// resources' lock keys, so two batches never take two locks in opposite orders. Element
/// `i` of the answer is the mark element `i` leaves. The functions keep their statements'
/// plans on the connection: the server parses and plans a short call per batch.
const RAISE_MANY: &str = "SELECT fence_decide_many($1, $2)";

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
/// one call of `fence_decide_many` (migration `0006`) over arrays, which reads every mark
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
/// # Connections
///
/// [`from_pool`](Self::from_pool) takes a `deadpool_postgres::Pool`: as many batches in
/// flight as the pool has connections, and a closed connection is replaced by the pool.
/// [`new`](Self::new) takes one client: one batch in flight; if that connection closes,
/// every raise fails with a retryable [`StoreError`] (the layer answers 503 on fenced
/// resources) until the store is rebuilt on a new client.
///
/// The queue task is started by the first raise, on that caller's tokio runtime, and
/// ends when the last clone of the store is dropped.
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
    source: Source,
    max_batch: usize,
    queue: OnceLock<mpsc::UnboundedSender<Pending>>,
    counts: Arc<Counts>,
}

/// Batches sent and the raises they carried, since the store was built.
#[derive(Default)]
struct Counts {
    batches: AtomicU64,
    raises: AtomicU64,
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

#[derive(Clone)]
enum Source {
    Client(Arc<Client>),
    Pool(deadpool_postgres::Pool),
}

impl Source {
    fn connections(&self) -> usize {
        match self {
            Source::Client(_) => 1,
            Source::Pool(pool) => pool.status().max_size.max(1),
        }
    }
}

/// A raise waiting for its batch.
struct Pending {
    resource: String,
    token: FencingToken,
    reply: oneshot::Sender<Result<Raise, StoreError>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("connections", &self.shared.source.connections())
            .field("max_batch", &self.shared.max_batch)
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
            shared: Arc::new(Shared {
                source,
                max_batch: DEFAULT_MAX_BATCH,
                queue: OnceLock::new(),
                counts: Arc::default(),
            }),
            seen: None,
        }
    }

    /// Sends at most `max` raises in one round trip (default 256; at least 1). Set it
    /// before the first raise: it makes a new store (clones made before keep theirs).
    #[must_use]
    pub fn with_max_batch(self, max: usize) -> Self {
        PostgresStore {
            shared: Arc::new(Shared {
                source: self.shared.source.clone(),
                max_batch: max.max(1),
                queue: OnceLock::new(),
                counts: Arc::default(),
            }),
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
        if let Some(seen) = &self.seen {
            if let Some(highest) = seen.get(resource) {
                if token.get() < highest {
                    return Ok(Raise::Stale {
                        highest: FencingToken::from_u64(highest).unwrap_or(FencingToken::MAX),
                    });
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
            return Err(StoreError::new("the store's queue task has stopped", true));
        }
        let outcome = answer
            .await
            .map_err(|_| StoreError::new("the store's queue task dropped a raise", true))??;
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
        match &self.shared.source {
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
        let old = match &self.shared.source {
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
            batches: self.shared.counts.batches.load(Ordering::Relaxed),
            raises: self.shared.counts.raises.load(Ordering::Relaxed),
        }
    }

    fn queue(&self) -> &mpsc::UnboundedSender<Pending> {
        self.shared.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(dispatch(
                self.shared.source.clone(),
                rx,
                self.shared.max_batch,
                Arc::clone(&self.shared.counts),
            ));
            tx
        })
    }
}

impl HighWaterStore for PostgresStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        let store = self.clone();
        let resource = resource.to_owned();
        Box::pin(async move { store.raise_async(&resource, token).await })
    }
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

/// The queue task: waits for a raise, then for a free connection, then takes every raise
/// queued meanwhile (up to `max_batch`) as one batch on that connection.
async fn dispatch(
    source: Source,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    max_batch: usize,
    counts: Arc<Counts>,
) {
    let permits = Arc::new(Semaphore::new(source.connections()));
    while let Some(first) = queue.recv().await {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        // The raise that woke this task ran it at once (tokio runs a woken task next): let
        // the tasks already runnable here, requests about to queue raises, run first, so
        // that under load the batch takes them all (fewer, larger batches), at the cost of
        // one pass over the run queue when idle.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        counts.batches.fetch_add(1, Ordering::Relaxed);
        counts
            .raises
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let source = source.clone();
        tokio::spawn(async move {
            run_batch(&source, batch).await;
            drop(permit);
        });
    }
}

/// Decides one batch and answers each raise in it.
async fn run_batch(source: &Source, batch: Vec<Pending>) {
    // Per resource: its index in the arrays and the highest token asked for.
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(batch.len());
    let mut resources: Vec<&str> = Vec::with_capacity(batch.len());
    let mut tokens: Vec<FencingToken> = Vec::with_capacity(batch.len());
    for p in &batch {
        let i = *index.entry(p.resource.as_str()).or_insert_with(|| {
            resources.push(p.resource.as_str());
            tokens.push(p.token);
            resources.len() - 1
        });
        tokens[i] = tokens[i].max(p.token);
    }
    let marks = match source {
        Source::Client(client) => raise_all(client, &resources, &tokens).await,
        Source::Pool(pool) => match pool.get().await {
            Ok(client) => raise_all(&client, &resources, &tokens).await,
            Err(e) => Err(Arc::new(StoreErrorSource::Pool(e.to_string()))),
        },
    };
    let verdicts: Vec<Result<Raise, StoreError>> = batch
        .iter()
        .map(|p| {
            let i = index[p.resource.as_str()];
            match &marks {
                Ok(marks) => {
                    let raised = tokens[i];
                    let mark = marks.get(i).copied().flatten();
                    Ok(if p.token == raised {
                        crate::postgres::verdict(raised, mark)
                    } else {
                        // Below the token raised in the same batch: decided as if just
                        // after that raise.
                        Raise::Stale {
                            highest: mark.map_or(raised, |m| m.max(raised)),
                        }
                    })
                }
                Err(e) => Err(StoreError::new(Arc::clone(e), e.is_retryable())),
            }
        })
        .collect();
    for (p, verdict) in batch.into_iter().zip(verdicts) {
        // A caller that went away no longer wants its verdict.
        let _ = p.reply.send(verdict);
    }
}

/// The marks `fence_raise` leaves for each resource, in order: one statement, one round
/// trip, unnamed.
async fn raise_all(
    client: &Client,
    resources: &[&str],
    tokens: &[FencingToken],
) -> Result<Vec<Option<FencingToken>>, Arc<StoreErrorSource>> {
    let result = if let ([resource], [token]) = (resources, tokens) {
        client
            .query_typed_one(RAISE_ONE, &[(resource, Type::TEXT), (token, Type::INT8)])
            .await
            .and_then(|row| row.try_get::<_, Option<FencingToken>>(0))
            .map(|mark| vec![mark])
    } else {
        client
            .query_typed_one(
                RAISE_MANY,
                &[(&resources, Type::TEXT_ARRAY), (&tokens, Type::INT8_ARRAY)],
            )
            .await
            .and_then(|row| row.try_get::<_, Vec<Option<FencingToken>>>(0))
    };
    result.map_err(|e| Arc::new(StoreErrorSource::Db(e)))
}

/// Why a batch failed, shared by every raise in it.
#[derive(Debug, thiserror::Error)]
enum StoreErrorSource {
    #[error("the raise failed in the database")]
    Db(#[source] tokio_postgres::Error),
    #[error("no connection from the pool: {0}")]
    Pool(String),
}

impl StoreErrorSource {
    fn is_retryable(&self) -> bool {
        match self {
            StoreErrorSource::Db(e) => is_retryable(e) || e.is_closed(),
            StoreErrorSource::Pool(_) => true,
        }
    }
}
