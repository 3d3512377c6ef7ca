//! The store's queue task and its batches: raises queued while every connection is busy
//! go to the database together, in one statement and one round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OnceCell, Semaphore};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use crate::postgres::{is_retryable, needs_session};
use crate::{FencingToken, Raise, StoreError};

/// One raise, in a transaction of its own: the helper's `palisade_fence.fence_decide`: a
/// token not above the committed mark is decided by the read alone (no lock,
/// no write); a newer one, or a resource's first, goes through `fence_raise` (see
/// [`crate::postgres`]), which takes the resource's lock exclusive and upserts the row.
const RAISE_ONE: &str = "SELECT palisade_fence.fence_decide($1, $2)";
/// Many raises in one statement: `fence_decide_many`, [`RAISE_ONE`] for each element (each
/// mark read by an index lookup), the `fence_raise` calls made in the order of the
/// resources' lock keys, so two batches never take two locks in opposite orders. Element
/// `i` of the answer is the mark element `i` leaves. The functions keep their statements'
/// plans on the connection: the server parses and plans a short call per batch.
const RAISE_MANY: &str = "SELECT palisade_fence.fence_decide_many($1, $2)";

/// [`RAISE_ONE`] as the store prepares it: a second column, a constant, signs the answer.
/// A server connection may hold another client's statement under the name the store
/// prepared its own as (behind a transaction-mode pooler); the answer of that statement
/// lacks the signature, and the batch fails instead of taking it for a mark.
const PREPARED_ONE: &str =
    "SELECT palisade_fence.fence_decide($1, $2), 'palisade_fence.decide'::text";
/// [`RAISE_MANY`] as the store prepares it, signed as [`PREPARED_ONE`] is.
const PREPARED_MANY: &str =
    "SELECT palisade_fence.fence_decide_many($1, $2), 'palisade_fence.decide_many'::text";

/// What the queue task and its batches share: where to send them and how.
pub(super) struct Batcher {
    pub(super) source: Source,
    pub(super) max_batch: usize,
    /// Named statements prepared once per connection, instead of unnamed ones.
    pub(super) prepared: bool,
    /// The named statements of a [`Source::Client`] (a pool's are cached per connection).
    statements: OnceCell<Statements>,
    pub(super) counts: Counts,
}

impl Batcher {
    pub(super) fn new(source: Source, max_batch: usize, prepared: bool) -> Self {
        Batcher {
            source,
            max_batch,
            prepared,
            statements: OnceCell::new(),
            counts: Counts::default(),
        }
    }
}

/// [`RAISE_ONE`] and [`RAISE_MANY`], prepared on one connection.
struct Statements {
    one: Statement,
    many: Statement,
}

/// Batches sent and the raises they carried, since the store was built.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) batches: AtomicU64,
    pub(super) raises: AtomicU64,
}

/// Where batches go: one client (one batch in flight) or a pool.
#[derive(Clone)]
pub(super) enum Source {
    Client(Arc<Client>),
    Pool(deadpool_postgres::Pool),
}

impl Source {
    pub(super) fn connections(&self) -> usize {
        match self {
            Source::Client(_) => 1,
            Source::Pool(pool) => pool.status().max_size.max(1),
        }
    }
}

/// A raise waiting for its batch.
pub(super) struct Pending {
    pub(super) resource: String,
    pub(super) token: FencingToken,
    pub(super) reply: oneshot::Sender<Result<Raise, StoreError>>,
}

/// The queue task: waits for a raise, then for a free connection, then takes every raise
/// queued meanwhile (up to `max_batch`) as one batch on that connection.
///
/// The task holds the batcher, not the queue's sender: it ends when the last clone of the
/// store (and with it the sender) is dropped.
pub(super) async fn dispatch(batcher: Arc<Batcher>, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let permits = Arc::new(Semaphore::new(batcher.source.connections()));
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
        while batch.len() < batcher.max_batch {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let counts = &batcher.counts;
        counts.batches.fetch_add(1, Ordering::Relaxed);
        counts
            .raises
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move {
            run_batch(&batcher, batch).await;
            drop(permit);
        });
    }
}

/// Decides one batch and answers each raise in it.
async fn run_batch(batcher: &Batcher, batch: Vec<Pending>) {
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
    let marks = match &batcher.source {
        Source::Client(client) if batcher.prepared => {
            match batcher
                .statements
                .get_or_try_init(|| Statements::prepare(client))
                .await
            {
                Ok(statements) => {
                    let statement = statements.pick(resources.len());
                    raise_all(client, Some(statement), &resources, &tokens).await
                }
                Err(e) => Err(StoreErrorSource::db(e)),
            }
        }
        Source::Client(client) => raise_all(client, None, &resources, &tokens).await,
        Source::Pool(pool) => match pool.get().await {
            Ok(client) if batcher.prepared => {
                let (query, types, _) = statement_of(resources.len());
                match client.prepare_typed_cached(query, types).await {
                    Ok(statement) => {
                        raise_all(&client, Some(&statement), &resources, &tokens).await
                    }
                    Err(e) => Err(StoreErrorSource::db(e)),
                }
            }
            Ok(client) => raise_all(&client, None, &resources, &tokens).await,
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

/// The prepared statement that decides a batch of `len` resources, its parameters' types,
/// and the signature its second column carries.
fn statement_of(len: usize) -> (&'static str, &'static [Type], &'static str) {
    if len == 1 {
        (
            PREPARED_ONE,
            &[Type::TEXT, Type::INT8],
            "palisade_fence.decide",
        )
    } else {
        (
            PREPARED_MANY,
            &[Type::TEXT_ARRAY, Type::INT8_ARRAY],
            "palisade_fence.decide_many",
        )
    }
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
        let prepare = |len| {
            let (query, types, _) = statement_of(len);
            client.prepare_typed(query, types)
        };
        let (one, many) = tokio::try_join!(prepare(1), prepare(2))?;
        Ok(Statements { one, many })
    }

    fn pick(&self, len: usize) -> &Statement {
        if len == 1 {
            &self.one
        } else {
            &self.many
        }
    }
}

/// The marks `fence_raise` leaves for each resource, in order: one statement, one round
/// trip; `statement` when prepared (its query is [`statement_of`] the batch's length, and
/// an answer without its signature fails the batch), else unnamed.
async fn raise_all(
    client: &Client,
    statement: Option<&Statement>,
    resources: &[&str],
    tokens: &[FencingToken],
) -> Result<Vec<Option<FencingToken>>, Arc<StoreErrorSource>> {
    let row = match ((resources, tokens), statement) {
        (([resource], [token]), Some(statement)) => {
            client.query_one(statement, &[resource, token]).await
        }
        (([resource], [token]), None) => {
            client
                .query_typed_one(RAISE_ONE, &[(resource, Type::TEXT), (token, Type::INT8)])
                .await
        }
        (_, Some(statement)) => {
            let params: [&(dyn ToSql + Sync); 2] = [&resources, &tokens];
            client.query_one(statement, &params).await
        }
        (_, None) => {
            client
                .query_typed_one(
                    RAISE_MANY,
                    &[(&resources, Type::TEXT_ARRAY), (&tokens, Type::INT8_ARRAY)],
                )
                .await
        }
    };
    let row = match (row, statement) {
        (Ok(row), Some(_)) => {
            let (_, _, signature) = statement_of(resources.len());
            match row.try_get::<_, &str>(1) {
                Ok(signed) if signed == signature => row,
                _ => return Err(Arc::new(StoreErrorSource::Foreign)),
            }
        }
        (Ok(row), None) => row,
        // An answer that does not fit the statement prepared here came from another.
        (Err(e), Some(_)) if e.as_db_error().is_none() && !e.is_closed() => {
            return Err(Arc::new(StoreErrorSource::Foreign));
        }
        (Err(e), _) => return Err(StoreErrorSource::db(e)),
    };
    let marks = if resources.len() == 1 {
        row.try_get::<_, Option<FencingToken>>(0).map(|m| vec![m])
    } else {
        row.try_get::<_, Vec<Option<FencingToken>>>(0)
    };
    marks.map_err(StoreErrorSource::db)
}

/// Why a batch failed, shared by every raise in it.
#[derive(Debug, thiserror::Error)]
enum StoreErrorSource {
    #[error("the raise failed in the database")]
    Db(#[source] tokio_postgres::Error),
    #[error(
        "the store's prepared statement is not on the server connection this batch ran on: \
         with_prepared_statements needs a session (a direct connection or a session-mode \
         pool, not a transaction-mode pooler)"
    )]
    NeedsSession(#[source] tokio_postgres::Error),
    #[error(
        "the statement this batch ran under the store's prepared name is not the store's \
         (its answer lacks the store's signature): with_prepared_statements needs a session \
         (a direct connection or a session-mode pool, not a transaction-mode pooler)"
    )]
    Foreign,
    #[error("no connection from the pool: {0}")]
    Pool(String),
}

impl StoreErrorSource {
    fn db(e: tokio_postgres::Error) -> Arc<StoreErrorSource> {
        Arc::new(if needs_session(&e) {
            StoreErrorSource::NeedsSession(e)
        } else {
            StoreErrorSource::Db(e)
        })
    }

    fn is_retryable(&self) -> bool {
        match self {
            StoreErrorSource::Db(e) => is_retryable(e) || e.is_closed(),
            StoreErrorSource::NeedsSession(_) | StoreErrorSource::Foreign => false,
            StoreErrorSource::Pool(_) => true,
        }
    }
}
