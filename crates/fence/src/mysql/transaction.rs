//! The transaction forms: the raise first, then the caller's statements, then `COMMIT`.

use std::future::Future;
use std::pin::Pin;

use mysql_async::{Conn, Transaction, TxOpts};

use super::{raise, MysqlFenceError};
use crate::FencingToken;

/// The future a [`fenced_transaction`] body returns: `Box::pin(async move { … })`.
pub type TxFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// Begins a transaction on `conn` with `options` (its isolation level, say) and raises
/// `resource`'s mark to `token` in it: `START TRANSACTION`, then `CALL fence_raise(?, ?)`.
///
/// On success the transaction holds the resource's row lock (exclusive) until it commits
/// or rolls back: run your statements on it and `commit` it; dropped, it is rolled back
/// (mysql_async sends `ROLLBACK` before the connection's next statement, or the pool
/// does before handing the connection out again). Every other writer of the resource
/// waits until then, so the writers commit in token order (the [module
/// docs](crate::mysql)).
///
/// # Errors
///
/// - [`Stale`](super::MysqlFenceErrorKind::Stale) if `token` is below the mark, with the
///   mark as [`MysqlFenceError::highest`]; the transaction was rolled back and nothing was
///   written.
/// - A database error of `START TRANSACTION` or the raise (see
///   [`MysqlFenceError::is_retryable`]: a deadlock, a lock wait timeout, a closed
///   connection); the transaction was rolled back.
pub async fn begin_fenced<'c>(
    conn: &'c mut Conn,
    options: TxOpts,
    resource: &str,
    token: FencingToken,
) -> Result<Transaction<'c>, MysqlFenceError> {
    let mut tx = conn.start_transaction(options).await?;
    match raise(&mut tx, resource, token).await {
        Ok(()) => Ok(tx),
        Err(e) => {
            // MariaDB keeps the transaction open after an error: end it here. A failed
            // rollback ends it anyway (mysql_async rolls back a dropped transaction).
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Runs `body` in a transaction that first raises `resource`'s mark to `token`, then
/// commits; at the server's default isolation level (see [`begin_fenced`] to pick one).
///
/// The body runs only if the token is admitted, while the transaction holds the
/// resource's row lock; so the bodies of one resource's writers commit with
/// non-decreasing tokens (see the [module docs](crate::mysql)). If the body fails, the
/// transaction is rolled back and the body's error returned.
///
/// Round trips: `START TRANSACTION`, the raise, one per statement of the body, `COMMIT`.
///
/// # Errors
///
/// - `E::from(MysqlFenceError)` of kind [`Stale`](super::MysqlFenceErrorKind::Stale) if
///   `token` is below the mark (the body never ran), or a database error from `START
///   TRANSACTION`, the raise or `COMMIT`; the transaction was rolled back.
/// - The body's own error; the transaction was rolled back.
pub async fn fenced_transaction<'c, T, E, F>(
    conn: &'c mut Conn,
    resource: &str,
    token: FencingToken,
    body: F,
) -> Result<T, E>
where
    F: for<'t> FnOnce(&'t mut Transaction<'c>) -> TxFuture<'t, T, E>,
    E: From<MysqlFenceError>,
{
    let mut tx = begin_fenced(conn, TxOpts::default(), resource, token).await?;
    match body(&mut tx).await {
        Ok(value) => {
            tx.commit().await.map_err(MysqlFenceError::from)?;
            Ok(value)
        }
        Err(e) => {
            // The body's error is the one that matters; a failed rollback ends the
            // transaction anyway (the connection is closed or rolls back on next use).
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}
