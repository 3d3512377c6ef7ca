//! Conditional writes on PostgreSQL: the check and the write in one transaction.
//!
//! A fenced write is only safe when the token check and the write are one atomic step.
//! Here that step is a transaction that begins by raising the resource's row in
//! `fence_high_water` (one `INSERT … ON CONFLICT (resource) DO UPDATE … WHERE
//! fence_high_water.token <= EXCLUDED.token RETURNING token` statement). The upsert takes
//! the row lock whether or not it raises, and Postgres holds it until the transaction
//! ends, so:
//!
//! - writers of one resource run their fenced transactions one at a time, in the order
//!   they take the row lock; a writer whose token is below the mark committed by an
//!   earlier writer is refused before any of its statements run;
//! - therefore the committed transactions of one resource, in commit order, carry
//!   non-decreasing tokens, and a refused writer leaves nothing behind.
//!
//! This holds at the default `READ COMMITTED` level (the upsert always sees the latest
//! committed mark). At `REPEATABLE READ` or `SERIALIZABLE` a concurrent raise shows up as
//! a serialization failure instead: [`FenceError::is_retryable`].
//!
//! Three forms:
//! - [`fenced_transaction`] (or [`begin_fenced`] to drive the transaction yourself): any
//!   statements, on any tables, guarded by the resource's high-water row. `BEGIN`, the
//!   raise, each statement of the body and `COMMIT` are one round trip each: the body
//!   only starts once the raise admitted the token.
//! - [`fenced_execute`]: the same guard for prepared statements that do not depend on each
//!   other's results, in one round trip (`BEGIN`, raise, statements, `COMMIT` pipelined;
//!   a refused token makes the raise fail, which aborts the rest).
//! - [`FencedUpdate`]: for a table that carries its own `fence_token` column, the check is
//!   folded into the `UPDATE` itself (`… AND fence_token <= $token`), one statement and no
//!   high-water row; zero rows is told apart as [`FenceErrorKind::RowMissing`] or
//!   [`FenceErrorKind::Stale`].
//!
//! Run [`migrate`] once to create `fence_high_water` ([`MIGRATION`] is the SQL, for your
//! own migration tool).
//!
//! # Examples
//!
//! ```no_run
//! use palisade_fence::{fenced_transaction, migrate, FenceError, FencingToken};
//!
//! # async fn example(mut client: tokio_postgres::Client, token: FencingToken) -> Result<(), FenceError> {
//! migrate(&mut client).await?;
//! let rows = fenced_transaction(&mut client, "orders/42", token, |tx| {
//!     Box::pin(async move {
//!         let n = tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
//!         Ok::<_, FenceError>(n)
//!     })
//! })
//! .await;
//! match rows {
//!     Ok(n) => println!("updated {n} rows"),
//!     Err(e) if e.is_stale() => println!("refused: the resource has seen {:?}", e.highest()),
//!     Err(e) => return Err(e),
//! }
//! # Ok(())
//! # }
//! ```

mod error;
mod pipeline;
mod update;

use std::future::Future;
use std::pin::Pin;

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

pub use error::{FenceError, FenceErrorKind};
pub(crate) use error::is_retryable;
pub use pipeline::{fenced_execute, FencedStatement, PreparedFence};
pub use update::{FencedUpdate, PreparedFencedUpdate};

use crate::store::Raise;
use crate::FencingToken;

/// The SQL that creates `fence_high_water` (idempotent: `CREATE TABLE IF NOT EXISTS`).
pub const MIGRATION: &str = include_str!("../../migrations/0001_fence_high_water.sql");

const RAISE: &str = "INSERT INTO fence_high_water (resource, token, updated_at) VALUES ($1, $2, now()) \
     ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now() \
     WHERE fence_high_water.token <= EXCLUDED.token RETURNING token";
const MARK: &str = "SELECT token FROM fence_high_water WHERE resource = $1";

/// Creates `fence_high_water` if it does not exist, under a transaction-scoped advisory
/// lock so that replicas starting together do not race.
///
/// # Errors
///
/// The database error, as a [`FenceError`] of kind `Database` or `Closed`.
pub async fn migrate<C: GenericClient + Send + Sync>(client: &mut C) -> Result<(), FenceError> {
    let tx = client.transaction().await?;
    // 0x70616c69 = "pali": one fixed key for this migration.
    tx.batch_execute("SELECT pg_advisory_xact_lock(1885432937)").await?;
    tx.batch_execute(MIGRATION).await?;
    tx.commit().await?;
    Ok(())
}

/// The compare-and-raise: one statement (one round trip; typed parameters, no prepare),
/// plus a read of the mark only when the token is refused.
pub(crate) async fn raise<C: GenericClient + Sync>(
    client: &C,
    resource: &str,
    token: FencingToken,
) -> Result<Raise, tokio_postgres::Error> {
    let raised = client.query_typed_opt(RAISE, &[(&resource, Type::TEXT), (&token, Type::INT8)]).await?;
    if raised.is_some() {
        return Ok(Raise::Admitted);
    }
    let row = client.query_typed_opt(MARK, &[(&resource, Type::TEXT)]).await?;
    // The upsert found a row (else it would have inserted); marks are never deleted by
    // this crate, but a row deleted meanwhile reads as the token itself.
    let highest = row.map(|r| r.get::<_, FencingToken>(0)).unwrap_or(token);
    Ok(Raise::Stale { highest })
}

/// Begins a transaction on `client` and raises `resource`'s high-water row to `token`.
///
/// On success the transaction holds the row lock: run your statements on it and commit
/// (dropping it rolls back). Other fenced writers of `resource` wait until then.
///
/// # Errors
///
/// - [`FenceErrorKind::Stale`] if `token` is below the mark; the transaction is rolled
///   back and nothing was written.
/// - A database error otherwise (see [`FenceError::is_retryable`]).
pub async fn begin_fenced<'c, C: GenericClient + Send + Sync>(
    client: &'c mut C,
    resource: &str,
    token: FencingToken,
) -> Result<Transaction<'c>, FenceError> {
    let tx = client.transaction().await?;
    match raise(&tx, resource, token).await? {
        Raise::Admitted => Ok(tx),
        Raise::Stale { highest } => {
            tx.rollback().await?;
            Err(FenceError::stale(token, highest))
        }
    }
}

/// The future a [`fenced_transaction`] body returns: `Box::pin(async move { … })`.
pub type TxFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// Runs `body` in a transaction that first raises `resource`'s high-water row to `token`,
/// then commits.
///
/// The body runs only if the token is admitted, while the transaction holds the row lock;
/// so the bodies of one resource's writers commit one at a time with non-decreasing
/// tokens (see the [module docs](crate::postgres)). If the body fails, the transaction is rolled
/// back and its error returned.
///
/// # Errors
///
/// - `E::from(FenceError)` of kind [`Stale`](FenceErrorKind::Stale) if `token` is below the
///   mark (the body never ran), or a database error from `BEGIN`, the raise or `COMMIT`.
/// - The body's own error.
pub async fn fenced_transaction<C, T, E, F>(
    client: &mut C,
    resource: &str,
    token: FencingToken,
    body: F,
) -> Result<T, E>
where
    C: GenericClient + Send + Sync,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> TxFuture<'t, T, E>,
    E: From<FenceError>,
{
    let tx = begin_fenced(client, resource, token).await?;
    match body(&tx).await {
        Ok(value) => {
            tx.commit().await.map_err(FenceError::from)?;
            Ok(value)
        }
        Err(e) => {
            // The body's error is the one that matters; a failed rollback closes the
            // transaction on the server anyway.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}
