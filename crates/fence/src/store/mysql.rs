//! A durable high-water store on MySQL/MariaDB, shared by every replica of a service.

use std::time::Duration;

use mysql_async::consts::StatusFlags;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool};

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::mark::{Mark, MarkReset, ResetGuard};
use crate::mysql::{self, MysqlFenceError, MysqlFenceErrorKind};
use crate::FencingToken;

/// How long a raise may take by default, connection included, before it fails with a
/// retryable [`StoreError`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// High-water marks in MariaDB's (or MySQL's) `fence_high_water` table, raised by the
/// procedure `fence_raise` over a pool of connections. Create the table and procedures
/// with [`migrate`](crate::mysql::migrate) (or the SQL of [`MIGRATION`](crate::mysql::MIGRATION)).
///
/// # How a raise is decided
///
/// Each raise is one statement, `CALL fence_raise(resource, token)`, a transaction of its
/// own: in autocommit mode the procedure makes it one; on a connection with
/// `autocommit=0` the store ends the implicit transaction itself (`COMMIT` after an
/// admit, `ROLLBACK` after an error, one more round trip). In it the upsert locks the
/// resource's row exclusive and raises the mark only if the token is at least it; a
/// lower token is refused with the mark (SQLSTATE `45000`), and nothing is written. The
/// row lock makes it atomic per resource across every process that shares the database,
/// and with every [`fenced_transaction`](crate::mysql::fenced_transaction) in flight (a
/// raise waits for them). One round trip per raise: mysql_async prepares the statement
/// once per connection.
///
/// The store's account needs only `EXECUTE` on `fence_raise` (and `SELECT` on
/// `fence_high_water` for [`mark`](Self::mark), `EXECUTE` on `fence_reset` for
/// [`reset`](Self::reset)).
///
/// # Failures
///
/// A database that is down, a connection refused, reset or killed, a deadlock, a lock
/// wait timeout, or a raise taking longer than the timeout (5 s by default,
/// [`with_timeout`](Self::with_timeout)) fail the raise with a retryable
/// [`StoreError`]: the [`FenceLayer`](crate::FenceLayer) answers 503 and the write does
/// not reach the service. Any other database error (a missing procedure, `EXECUTE`
/// denied, a resource name longer than the 3,072 bytes the key holds) is a
/// [`StoreError`] that is not retryable. Never an admit. A raise whose future is dropped
/// (or times out) after the statement was sent may still have raised the mark; a mark
/// raised without a write refuses only tokens below one a holder was granted.
#[derive(Debug, Clone)]
pub struct MysqlStore {
    pool: Pool,
    timeout: Duration,
}

impl MysqlStore {
    /// A store on `pool`'s database (the database the pool's URL names is the fence's).
    pub fn new(pool: Pool) -> Self {
        MysqlStore {
            pool,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// A store on a new pool for `url` (`mysql://user:password@host:3306/database`, with
    /// mysql_async's pool parameters such as `?pool_min=1&pool_max=16`).
    ///
    /// # Errors
    ///
    /// Kind [`Database`](MysqlFenceErrorKind::Database) when the URL does not parse.
    /// Nothing is connected yet: a database that is down fails the raises, not this.
    pub fn from_url(url: &str) -> Result<Self, MysqlFenceError> {
        let opts = Opts::from_url(url).map_err(mysql_async::Error::from)?;
        Ok(MysqlStore::new(Pool::new(opts)))
    }

    /// Fails a raise that takes longer than `timeout` (connecting included) with a
    /// retryable [`StoreError`]. Default 5 s.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The raise as an `async fn`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`]: retryable for a closed or refused connection, a deadlock, a lock
    /// wait timeout or the store's timeout; not retryable for any other database error.
    pub async fn raise_async(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Result<Raise, StoreError> {
        raise(self.pool.clone(), self.timeout, resource.to_owned(), token).await
    }

    /// Reads `resource`'s mark from the database; `None` when it has none. See
    /// [`read_mark`](crate::mysql::read_mark).
    ///
    /// # Errors
    ///
    /// The database error, or kind [`Closed`](MysqlFenceErrorKind::Closed) when no
    /// connection could be had.
    pub async fn mark(&self, resource: &str) -> Result<Option<Mark>, MysqlFenceError> {
        let mut conn = self.pool.get_conn().await?;
        mysql::read_mark(&mut conn, resource).await
    }

    /// The last `limit` resets of `resource`, newest first. See
    /// [`read_resets`](crate::mysql::read_resets).
    ///
    /// # Errors
    ///
    /// As [`mark`](Self::mark).
    pub async fn resets(
        &self,
        resource: &str,
        limit: i64,
    ) -> Result<Vec<MarkReset>, MysqlFenceError> {
        let mut conn = self.pool.get_conn().await?;
        mysql::read_resets(&mut conn, resource, limit).await
    }

    /// Lowers `resource`'s mark to `to` for `reason`, checked against `guard`; returns the
    /// mark it replaced. See [`reset_mark_guarded`](crate::mysql::reset_mark_guarded) for
    /// the rules that keep a reset from re-admitting a stale writer.
    ///
    /// # Errors
    ///
    /// As [`reset_mark_guarded`](crate::mysql::reset_mark_guarded), or kind
    /// [`Closed`](MysqlFenceErrorKind::Closed) when no connection could be had.
    pub async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
        guard: &ResetGuard,
    ) -> Result<FencingToken, MysqlFenceError> {
        let mut conn = self.pool.get_conn().await?;
        mysql::reset_mark_guarded(&mut conn, resource, to, reason, guard).await
    }
}

impl HighWaterStore for MysqlStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        Box::pin(raise(
            self.pool.clone(),
            self.timeout,
            resource.to_owned(),
            token,
        ))
    }
}

async fn raise(
    pool: Pool,
    timeout: Duration,
    resource: String,
    token: FencingToken,
) -> Result<Raise, StoreError> {
    let attempt = async {
        let mut conn = pool.get_conn().await?;
        raise_alone(&mut conn, &resource, token).await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => Err(StoreError::new(
            format!("no answer from MySQL/MariaDB to the raise of {resource:?} within {timeout:?}"),
            true,
        )),
        Ok(Ok(())) => Ok(Raise::Admitted),
        Ok(Err(e)) => match (e.kind(), e.highest()) {
            (MysqlFenceErrorKind::Stale, Some(highest)) => Ok(Raise::Stale { highest }),
            _ => {
                let retryable = e.is_retryable();
                Err(StoreError::new(e, retryable))
            }
        },
    }
}

/// The raise as a transaction of its own on any connection. With `autocommit=1` (the
/// server's default) `fence_raise` commits it itself; on a connection with
/// `autocommit=0` (the server's `autocommit` setting, or the pool's init statements) the
/// call runs in the session's implicit transaction, which this ends: `COMMIT` after an
/// admit (so the mark is raised and the row lock released at once), `ROLLBACK` after an
/// error (MariaDB keeps the transaction open after one).
async fn raise_alone(
    conn: &mut Conn,
    resource: &str,
    token: FencingToken,
) -> Result<(), MysqlFenceError> {
    match mysql::raise(conn, resource, token).await {
        Ok(()) => {
            // The status of the CALL's last OK packet: still in a transaction?
            let open = conn.last_ok_packet().is_none_or(|ok| {
                ok.status_flags()
                    .contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            });
            if open {
                conn.query_drop("COMMIT").await?;
            }
            Ok(())
        }
        Err(e) => {
            // No OK packet for the failed call: roll back unless the session is known to
            // be in autocommit mode (then the procedure rolled back its own transaction).
            let autocommit = conn.last_ok_packet().is_some_and(|ok| {
                ok.status_flags()
                    .contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT)
                    && !ok
                        .status_flags()
                        .contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            });
            if !autocommit && e.kind() != MysqlFenceErrorKind::Closed {
                // The raise's error is the one to report; a failed rollback ends the
                // transaction anyway (the connection is closed or reset by the pool).
                let _ = conn.query_drop("ROLLBACK").await;
            }
            Err(e)
        }
    }
}
