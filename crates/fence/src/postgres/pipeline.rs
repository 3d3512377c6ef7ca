//! The pipelined form: `BEGIN`, the raise, the statements and `COMMIT` in one round trip.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use bytes::BytesMut;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use super::{FenceError, MARK};
use crate::FencingToken;

/// The raise of [`fenced_execute`]: [`fenced_transaction`]'s raise (`fence_raise`), but a
/// refused token fails the statement with [`STALE`], which aborts the transaction, so the
/// statements sent after it in the same round trip do nothing.
///
/// [`fenced_transaction`]: super::fenced_transaction
const RAISE_OR_ABORT: &str = "SELECT palisade_fence.fence_raise_or_abort($1, $2)";

/// The SQLSTATE `fence_raise_or_abort` raises for a refused token (defined in the crate's
/// [`MIGRATION`](crate::MIGRATION); class `PF` is used by no Postgres error).
const STALE: &str = "PF001";

/// One statement of a [`fenced_execute`]: a statement prepared on the same connection,
/// and its parameters.
pub type FencedStatement<'a> = (&'a Statement, &'a [&'a (dyn ToSql + Sync)]);

type Step<'a> = Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;

/// Runs `statements` in one transaction guarded by `resource`'s high-water row, in **one
/// round trip**: `BEGIN`, the compare-and-raise, the statements and `COMMIT` are sent
/// together (tokio-postgres pipelines requests polled together, in the order they are
/// first polled) and the answers read afterwards.
///
/// The guarantee is [`fenced_transaction`](super::fenced_transaction)'s: the raise takes
/// the resource's lock (exclusive for a newer token, shared for an equal one) before any
/// statement runs and holds it until `COMMIT`, so the
/// committed writes of one resource carry non-decreasing tokens. A refused token makes
/// the raise fail, which aborts the transaction: the statements after it fail without
/// effect and the `COMMIT` ends as a rollback. Any failing statement rolls everything
/// back the same way. Returns the row count of each statement, in order.
///
/// Use it when the statements do not depend on each other's results (an `UPDATE`, an
/// `INSERT` into a log...); for logic between statements use `fenced_transaction`, which
/// costs a round trip per statement plus two (`BEGIN` with the raise, and `COMMIT`).
///
/// # Requirements
///
/// - `client` must not be inside a transaction (a `Client` borrowed by a tokio-postgres
///   `Transaction` cannot be passed here anyway; do not `BEGIN` by hand before).
/// - Each statement was prepared on `client`, so its server session must be the one the
///   transaction runs on: behind a transaction-mode pooler this fails with
///   [`NeedsSession`](super::FenceErrorKind::NeedsSession) (see
///   [the module docs](super#behind-a-connection-pooler)). Parameters are checked against the
///   statements' types (and encoded once) before anything is sent, so a wrong parameter
///   never leaves the earlier statements to commit alone.
///
/// If the returned future is dropped after its first poll, the whole transaction has
/// been sent and the server commits or rolls it back on its own; the outcome is then
/// unknown to the caller, as with any lost answer.
///
/// # Errors
///
/// - [`FenceErrorKind::Stale`](super::FenceErrorKind::Stale) if `token` is below the
///   mark; nothing was written ([`FenceError::highest`] is read with one more query).
/// - [`FenceErrorKind::BadParameters`](super::FenceErrorKind::BadParameters): a parameter
///   list does not match its statement (count or type); nothing was sent.
/// - The first database error of the raise, a statement or `COMMIT` (see
///   [`FenceError::is_retryable`]); the transaction was rolled back.
pub async fn fenced_execute(
    client: &Client,
    resource: &str,
    token: FencingToken,
    statements: &[FencedStatement<'_>],
) -> Result<Vec<u64>, FenceError> {
    pipelined(client, None, resource, token, statements).await
}

/// The raise of [`fenced_execute`], prepared on one connection: the same one-round-trip
/// fenced write, with the server keeping the plan of the raise's `SELECT` instead of
/// planning it on every call (the function's own statements keep their plans either
/// way).
///
/// Like a tokio-postgres `Statement`, it belongs to the server session it was prepared
/// on: on another connection, or behind a transaction-mode pooler, the server answers
/// "prepared statement does not exist" (SQLSTATE `26000`, kind
/// [`NeedsSession`](super::FenceErrorKind::NeedsSession)) and nothing is written.
#[derive(Debug, Clone)]
pub struct PreparedFence {
    raise: Statement,
}

impl PreparedFence {
    /// Prepares the raise on `client`'s connection.
    ///
    /// # Errors
    ///
    /// The database error (for example `fence_high_water` does not exist: run
    /// [`migrate`](crate::migrate)).
    pub async fn prepare(client: &Client) -> Result<PreparedFence, FenceError> {
        Ok(PreparedFence {
            raise: client
                .prepare_typed(RAISE_OR_ABORT, &[Type::TEXT, Type::INT8])
                .await?,
        })
    }

    /// [`fenced_execute`] with the prepared raise; same guarantees, requirements and
    /// errors.
    ///
    /// # Errors
    ///
    /// As [`fenced_execute`].
    pub async fn execute(
        &self,
        client: &Client,
        resource: &str,
        token: FencingToken,
        statements: &[FencedStatement<'_>],
    ) -> Result<Vec<u64>, FenceError> {
        pipelined(client, Some(&self.raise), resource, token, statements).await
    }
}

async fn pipelined(
    client: &Client,
    raise: Option<&Statement>,
    resource: &str,
    token: FencingToken,
    statements: &[FencedStatement<'_>],
) -> Result<Vec<u64>, FenceError> {
    check_params(statements)?;
    let mut steps: Vec<Step<'_>> = Vec::with_capacity(statements.len() + 3);
    steps.push(Box::pin(async move {
        client.batch_execute("BEGIN").await.map(|()| 0)
    }));
    steps.push(match raise {
        None => Box::pin(async move {
            let rows = client
                .query_typed(
                    RAISE_OR_ABORT,
                    &[(&resource, Type::TEXT), (&token, Type::INT8)],
                )
                .await?;
            Ok(rows.len() as u64)
        }),
        Some(raise) => {
            Box::pin(
                async move { Ok(client.query(raise, &[&resource, &token]).await?.len() as u64) },
            )
        }
    });
    for &(statement, params) in statements {
        steps.push(Box::pin(client.execute(statement, params)));
    }
    steps.push(Box::pin(async move {
        client.batch_execute("COMMIT").await.map(|()| 0)
    }));

    let mut results = in_order(steps).await.into_iter();
    let mut next = || results.next().unwrap_or(Ok(0));
    next()?; // BEGIN
    if let Err(e) = next() {
        if e.code().map(SqlState::code) == Some(STALE) {
            // Refused. The transaction is over (its COMMIT was a rollback): read the mark.
            let row = client
                .query_typed_opt(MARK, &[(&resource, Type::TEXT)])
                .await?;
            let highest = row.map(|r| r.get::<_, FencingToken>(0)).unwrap_or(token);
            return Err(FenceError::stale(token, highest));
        }
        return Err(e.into());
    }
    let mut counts = Vec::with_capacity(statements.len());
    for _ in statements {
        counts.push(next()?);
    }
    next()?; // COMMIT
    Ok(counts)
}

/// Encodes every parameter once into a scratch buffer: what would fail while sending
/// (wrong count, wrong type, a value its type refuses) fails here, before anything is sent.
fn check_params(statements: &[FencedStatement<'_>]) -> Result<(), FenceError> {
    let mut scratch = BytesMut::new();
    for &(statement, params) in statements {
        let types = statement.params();
        if types.len() != params.len() {
            return Err(FenceError::bad_params(params.len(), types.len()));
        }
        for (param, ty) in params.iter().zip(types) {
            scratch.clear();
            param
                .to_sql_checked(ty, &mut scratch)
                .map_err(FenceError::bad_param)?;
        }
    }
    Ok(())
}

/// Polls every step, always in the given order, until all have finished. The first poll
/// of a tokio-postgres request sends it, so the requests go out in this order.
async fn in_order(mut steps: Vec<Step<'_>>) -> Vec<Result<u64, tokio_postgres::Error>> {
    let mut out: Vec<Option<Result<u64, tokio_postgres::Error>>> =
        steps.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (step, slot) in steps.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match step.as_mut().poll(cx) {
                    Poll::Ready(r) => *slot = Some(r),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
