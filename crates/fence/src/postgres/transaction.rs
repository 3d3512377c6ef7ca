//! The closure form: `BEGIN` and the raise in one flight, then the body, then `COMMIT`.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;

use futures::FutureExt;
use tokio_postgres::Client;

use super::{raise, FenceError};
use crate::store::Raise;
use crate::FencingToken;

/// The future a [`fenced_transaction`] body returns: `Box::pin(async move { … })`.
pub type TxFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// An open transaction whose first statement raised a resource's high-water row to the
/// token it carries: what [`fenced_transaction`] hands its body, or what
/// [`FencedTransaction::begin`] returns for a caller that drives the transaction itself.
///
/// It derefs to the [`Client`] the transaction runs on, so a body calls
/// `tx.execute(…)`, `tx.query(…)`, `tx.prepare(…)` as on a tokio-postgres
/// `Transaction`; code written against `&Client` or
/// [`GenericClient`](tokio_postgres::GenericClient) takes `&**tx`. It holds the client
/// mutably borrowed, so no statement of another task can land inside the transaction.
/// What it does not offer is a nested transaction (a savepoint): for that, fence an
/// existing `Transaction` with [`begin_fenced`](super::begin_fenced).
///
/// Dropped without [`commit`](Self::commit) (a body that panicked or whose future was
/// dropped), it sends `ROLLBACK` without waiting for the answer, as a tokio-postgres
/// `Transaction` does; the statements the connection runs next come after it.
#[derive(Debug)]
pub struct FencedTransaction<'c> {
    client: &'c Client,
    /// `true` until `COMMIT` or `ROLLBACK` has been sent.
    open: bool,
}

impl<'c> FencedTransaction<'c> {
    /// Begins a transaction on `client` and raises `resource`'s high-water row to `token`,
    /// in **one round trip**: `BEGIN` (a simple query) and the raise (an unnamed
    /// statement with typed parameters, no prepare) are sent together and their answers
    /// read afterwards. Works behind a transaction-mode pooler.
    ///
    /// On success the transaction holds the resource's lock (exclusive if it raised the
    /// mark, shared if `token` equals the mark) until [`commit`](Self::commit) or
    /// [`rollback`](Self::rollback): the guarantee of the
    /// [module docs](crate::postgres).
    ///
    /// `client` must not be inside a transaction already (a `Client` borrowed by a
    /// tokio-postgres `Transaction` cannot be passed here anyway; do not `BEGIN` by hand
    /// before).
    ///
    /// # Errors
    ///
    /// - [`FenceErrorKind::Stale`](super::FenceErrorKind::Stale) if `token` is below the
    ///   mark, with the mark as [`FenceError::highest`]; the transaction is rolled back
    ///   and nothing was written.
    /// - A database error of `BEGIN` or the raise (see [`FenceError::is_retryable`]); the
    ///   transaction is rolled back.
    pub async fn begin(
        client: &'c mut Client,
        resource: &str,
        token: FencingToken,
    ) -> Result<FencedTransaction<'c>, FenceError> {
        let client: &'c Client = client;
        // Made before anything is sent: if this future is dropped mid-flight, or either
        // answer is an error, the guard's drop sends `ROLLBACK`.
        let mut tx = FencedTransaction { client, open: true };
        // `join` polls `BEGIN` first, and a tokio-postgres request is sent on its first
        // poll: the two go out in this order, in one flight.
        let (begun, raised) = futures::future::join(
            client.batch_execute("BEGIN"),
            raise(client, resource, token),
        )
        .await;
        begun?;
        match raised? {
            Raise::Admitted => Ok(tx),
            Raise::Stale { highest } => {
                tx.finish("ROLLBACK").await?;
                Err(FenceError::stale(token, highest))
            }
        }
    }

    /// Commits the transaction: the body's writes and the raised mark become visible
    /// together, and the resource's lock is released.
    ///
    /// # Errors
    ///
    /// The database error of `COMMIT` (for example a serialization failure at
    /// `REPEATABLE READ`, [`FenceError::is_retryable`]); nothing was committed.
    pub async fn commit(mut self) -> Result<(), FenceError> {
        self.finish("COMMIT").await
    }

    /// Rolls the transaction back: nothing it wrote stays, the mark included.
    ///
    /// # Errors
    ///
    /// The database error of `ROLLBACK` (the server ends the transaction anyway when the
    /// connection closes).
    pub async fn rollback(mut self) -> Result<(), FenceError> {
        self.finish("ROLLBACK").await
    }

    async fn finish(&mut self, statement: &str) -> Result<(), FenceError> {
        self.open = false;
        self.client.batch_execute(statement).await?;
        Ok(())
    }
}

impl Deref for FencedTransaction<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client
    }
}

impl Drop for FencedTransaction<'_> {
    fn drop(&mut self) {
        if self.open {
            // The first poll of a tokio-postgres request sends it; the answer is not
            // awaited (there is no one left to tell).
            let _ = self.client.batch_execute("ROLLBACK").now_or_never();
        }
    }
}

/// Runs `body` in a transaction that first raises `resource`'s high-water row to `token`,
/// then commits.
///
/// The body runs only if the token is admitted (it is called after the raise's verdict),
/// while the transaction holds the resource's lock; so the bodies of one resource's
/// writers commit with non-decreasing tokens (see the [module docs](crate::postgres)):
/// a newer token's body waits for every body in flight, bodies with one token run side
/// by side. If the body fails, the transaction is rolled back and its error returned.
///
/// Round trips: `BEGIN` and the raise together ([`FencedTransaction::begin`]), one per
/// statement of the body, `COMMIT`: three for a body of one statement, as many as the
/// same transaction without the fence. [`fenced_execute`](super::fenced_execute) sends
/// everything in one, for statements that do not depend on each other's results.
///
/// `client` is any connection: a `tokio_postgres::Client`, or a pooled one
/// (`&mut obj` for a deadpool-postgres `Object`); it must not be inside a transaction. To
/// fence inside a transaction you already hold, use [`begin_fenced`](super::begin_fenced).
///
/// # Errors
///
/// - `E::from(FenceError)` of kind [`Stale`](super::FenceErrorKind::Stale) if `token` is
///   below the mark (the body never ran), or a database error from `BEGIN`, the raise or
///   `COMMIT`.
/// - The body's own error.
pub async fn fenced_transaction<T, E, F>(
    client: &mut Client,
    resource: &str,
    token: FencingToken,
    body: F,
) -> Result<T, E>
where
    F: for<'t> FnOnce(&'t FencedTransaction<'t>) -> TxFuture<'t, T, E>,
    E: From<FenceError>,
{
    let tx = FencedTransaction::begin(client, resource, token).await?;
    match body(&tx).await {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(e) => {
            // The body's error is the one that matters; a failed rollback ends the
            // transaction on the server anyway.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}
