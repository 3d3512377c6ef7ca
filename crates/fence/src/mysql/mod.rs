//! The fence on MySQL/MariaDB (InnoDB): the check and the write in one transaction.
//!
//! A fenced write is only safe when the token check and the write are one atomic step.
//! Here that step is a transaction that begins with `CALL fence_raise(resource, token)`,
//! a stored procedure (created by [`migrate`] from [`MIGRATION`]) that
//!
//! - upserts the resource's row of `fence_high_water`, raising its mark to the token when
//!   the token is not below it (`INSERT … ON DUPLICATE KEY UPDATE token =
//!   GREATEST(token, VALUES(token))`);
//! - reads the mark back with a locking read (`SELECT … FOR UPDATE`);
//! - signals SQLSTATE `45000` (error 1644) when the mark is above the token, with the
//!   message `fence_raise: stale token <token>, mark <mark>, resource <resource>`: the
//!   caller rolls back and nothing is written.
//!
//! The procedure writes nothing but the mark, so a refused raise leaves the row as it
//! was.
//!
//! # Why the check holds
//!
//! InnoDB's `INSERT … ON DUPLICATE KEY UPDATE` takes the row's lock *exclusive* and
//! checks and updates the latest committed version of the row, not the transaction's
//! snapshot, at every isolation level; so does the locking read after it. The lock is
//! held until the transaction ends. So:
//!
//! - every writer of a resource holds its row's exclusive lock from its raise to its
//!   commit or rollback: the writers of one resource take turns, in the order InnoDB
//!   grants the lock;
//! - each writer decides against the mark the previous holder of the lock committed:
//!   a token below it is refused, a token at least the mark is admitted and becomes the
//!   mark;
//! - therefore the committed transactions of one resource, in commit order, carry
//!   non-decreasing tokens, and a refused writer leaves nothing behind (it rolls back).
//!
//! The argument: let A (token a) and B (token b > a) both commit. B's raise left the
//! mark at least b, under the lock. Had A been granted the lock after B, A would have
//! read that mark (the latest committed version, at any isolation level) and been
//! refused. So A was granted the lock first, and B could only be granted it once A had
//! committed: A committed before B. Writers with one token also take turns; their tokens
//! are equal.
//!
//! **The first write of a resource** has no row to lock. Two transactions that insert
//! its first mark at once meet on the primary key: the second one's insert finds the
//! first one's uncommitted row and waits for its lock (for `ON DUPLICATE KEY UPDATE`,
//! InnoDB requests the duplicate's lock exclusive, so the waiters do not deadlock on an
//! upgrade), then updates the row the first committed. This holds at `REPEATABLE READ`
//! (MariaDB's default) and at `READ COMMITTED` alike: neither step is a snapshot read.
//! At `REPEATABLE READ` a transaction that inserted a resource's first row and then
//! rolled back can leave its waiters a gap lock each, and two of them can then deadlock:
//! InnoDB rolls one back ([`MysqlFenceErrorKind::Deadlock`], retryable). Nothing wrong is
//! committed either way.
//!
//! `fence_raise` does no consistent (snapshot) read, so at `REPEATABLE READ` the writer's
//! snapshot begins at its own first plain `SELECT` after the raise: it sees every write
//! committed by the writers ordered before it. Call the raise first in the transaction
//! (a `SELECT` before it, or `START TRANSACTION WITH CONSISTENT SNAPSHOT`, would fix the
//! snapshot before the lock was granted). `UPDATE`s and locking reads see the latest
//! version at any level.
//!
//! The rule needs every writer of marks to raise through `fence_raise`: writers hold
//! `EXECUTE` on it and no privilege on the tables (the procedures are `SQL SECURITY
//! DEFINER`), so a writer cannot write or lower a mark but through it. The reset
//! procedure `fence_reset` lowers a mark, with a reason, and logs it
//! ([`reset_mark_guarded`]).
//!
//! **Which transaction `fence_raise` runs in.** Inside a transaction (`START TRANSACTION`,
//! as the helpers here begin, or the implicit one of `autocommit=0`, which a `CALL` as the
//! first statement starts), it runs in it and the lock is held until the caller commits
//! or rolls back. Only with `autocommit=1` outside a transaction does it commit a
//! transaction of its own, holding the lock for the `CALL` alone: a raise, not a fenced
//! write. Its token must be an integer (an integer parameter, or plain digits); `1.5`,
//! `'1e3'`, `' 7'` or `0x10` are refused (SQLSTATE `22003`) rather than rounded.
//!
//! **MariaDB does not abort a transaction on an error.** After the stale signal the
//! transaction is still open, and a client that ignores the error and goes on to
//! `COMMIT` commits its writes. Every helper here rolls back on any error; from SQL, run
//! `ROLLBACK` after an error (a multi-statement batch, and the `mariadb` client without
//! `--force`, stop at the first error). A lock wait timeout (error 1205) also rolls back
//! only its statement unless the server runs with `innodb_rollback_on_timeout`.
//!
//! Three forms:
//! - [`fenced_transaction`]: the raise, then the caller's statements, then `COMMIT`;
//!   [`begin_fenced`] to drive the transaction yourself, at the isolation level of your
//!   choice.
//! - [`FencedUpdate`]: for a table that carries its own `fence_token` column, the check is
//!   folded into the `UPDATE` itself (`… AND (fence_token IS NULL OR fence_token <= ?)`):
//!   one statement, no mark table, no procedure.
//! - [`MysqlStore`](crate::MysqlStore): the raise alone, for the
//!   [`FenceLayer`](crate::FenceLayer) and the proxy.
//!
//! # Settings
//!
//! | setting | needed |
//! |---|---|
//! | storage engine | InnoDB (the migration creates its tables with it) |
//! | isolation level | `REPEATABLE READ` or `READ COMMITTED` (both tested); `SERIALIZABLE` works too |
//! | `binlog_format` | `ROW` or `MIXED` (MariaDB's default): `fence_reset` logs `USER()`, which statement-based logging cannot replay |
//! | `log_bin_trust_function_creators` | not needed: the fence has procedures only, no stored functions or triggers |
//! | `innodb_rollback_on_timeout` | not needed: the helpers roll back after a lock wait timeout |
//!
//! Replication is asynchronous by default: a failover to a replica that had not received
//! a raise loses that mark, and re-admits tokens below it (see `docs/resources.md` for
//! what closes it: semi-synchronous replication, or a Galera cluster).
//!
//! # Examples
//!
//! ```no_run
//! use mysql_async::prelude::*;
//! use palisade_fence::mysql::{fenced_transaction, migrate, MysqlFenceError};
//! use palisade_fence::FencingToken;
//!
//! # async fn example(mut conn: mysql_async::Conn, token: FencingToken) -> Result<(), MysqlFenceError> {
//! migrate(&mut conn).await?;
//! let done = fenced_transaction(&mut conn, "orders/42", token, |tx| {
//!     Box::pin(async move {
//!         tx.query_drop("UPDATE orders SET state = 'paid' WHERE id = 42").await?;
//!         Ok::<_, MysqlFenceError>(tx.affected_rows())
//!     })
//! })
//! .await;
//! match done {
//!     Ok(n) => println!("updated {n} rows"),
//!     Err(e) if e.is_stale() => println!("refused: the resource has seen {:?}", e.highest()),
//!     Err(e) => return Err(e),
//! }
//! # Ok(())
//! # }
//! ```

mod admin;
mod error;
mod transaction;
mod update;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

pub use crate::mark::{Mark, MarkReset, ResetGuard};
pub use admin::{read_mark, read_resets, reset_mark, reset_mark_guarded};
pub use error::{MysqlFenceError, MysqlFenceErrorKind};
pub use transaction::{begin_fenced, fenced_transaction, TxFuture};
pub use update::FencedUpdate;

use crate::FencingToken;

/// The SQL of the fence on MySQL/MariaDB, `migrations/mysql/fence_schema.sql`: the mark
/// table `fence_high_water (resource VARBINARY(3072) PRIMARY KEY, token BIGINT,
/// updated_at DATETIME(6))`, the reset log `fence_reset_log`, and the procedures
/// `fence_raise` and `fence_reset`, each `SQL SECURITY DEFINER`. It installs into the
/// current database, with `DELIMITER` lines for the `mariadb` client
/// (`mariadb DB < fence_schema.sql`). Idempotent. The accounts and grants to give are in
/// `docs/resources.md`.
pub const MIGRATION: &str = include_str!("../../migrations/mysql/fence_schema.sql");

/// The raise: `fence_raise` signals 45000 for a stale token.
pub(crate) const RAISE: &str = "CALL fence_raise(?, ?)";

/// The name of the server lock [`migrate`] holds (`GET_LOCK`), so that replicas starting
/// together take turns.
const MIGRATE_LOCK: &str = "palisade_fence_migrate";

/// Runs [`MIGRATION`] on `conn`'s current database: creates the tables if missing and
/// (re)creates the procedures, one statement at a time, while holding the server lock
/// `palisade_fence_migrate` (`GET_LOCK`, up to 60 s) so that replicas starting together
/// take turns.
///
/// Run it as the fence's owner: the account that becomes the procedures' `DEFINER`,
/// whose rights they run with (it needs `CREATE`, `ALTER`, `CREATE ROUTINE`,
/// `ALTER ROUTINE`, `SELECT`, `INSERT` and `UPDATE` on the database). A writer, which
/// holds only `EXECUTE` on `fence_raise`, does not migrate. MySQL/MariaDB DDL commits
/// implicitly: a migration that fails part-way leaves what it created, and the next run
/// completes it.
///
/// # Errors
///
/// The database error, as a [`MysqlFenceError`] (kind `Database`: no database selected
/// (1046), a missing privilege (1044, 1142), or the migration lock not granted within
/// 60 s (the error names `palisade_fence_migrate`); kind `Closed`: the connection).
pub async fn migrate(conn: &mut Conn) -> Result<(), MysqlFenceError> {
    let granted: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, 60)", (MIGRATE_LOCK,))
        .await?;
    if granted.flatten() != Some(1) {
        return Err(MysqlFenceError::bad_value(
            "no grant of the migration lock palisade_fence_migrate within 60 s",
        ));
    }
    let mut result: Result<(), MysqlFenceError> = Ok(());
    for statement in statements(MIGRATION) {
        if let Err(e) = conn.query_drop(statement).await {
            result = Err(e.into());
            break;
        }
    }
    let released: Result<(), mysql_async::Error> =
        conn.exec_drop("DO RELEASE_LOCK(?)", (MIGRATE_LOCK,)).await;
    result?;
    Ok(released?)
}

/// The statements of a SQL script written for the `mariadb` client: split at the current
/// delimiter at the end of a line (`;` until a `DELIMITER` line changes it), with the
/// delimiter removed; lines of only a `--` comment are dropped.
pub(crate) fn statements(script: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut delimiter = ";";
    let mut start: Option<usize> = None;
    let mut offset = 0;
    for line in script.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        let trimmed = line.trim();
        if start.is_none() {
            if trimmed.is_empty() || trimmed.starts_with("--") {
                continue;
            }
            if let Some(d) = trimmed.strip_prefix("DELIMITER ") {
                delimiter = d.trim();
                continue;
            }
            start = Some(line_start);
        }
        if let (Some(s), Some(body)) = (start, trimmed.strip_suffix(delimiter)) {
            let end = line_start + line.find(trimmed).unwrap_or(0) + body.len();
            let statement = script[s..end].trim();
            if !statement.is_empty() {
                out.push(statement);
            }
            start = None;
        }
    }
    out
}

/// A token as the fence's `BIGINT` columns hold it: every token is below 2^63.
pub(crate) fn sql_token(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(i64::MAX)
}

/// The raise in the caller's transaction (an explicit one, or the implicit one of
/// `autocommit=0`, which the caller ends), or as a transaction of its own with
/// `autocommit=1` outside one: `Ok` when admitted; a stale token is an error of kind
/// `Stale`.
pub(crate) async fn raise<Q: Queryable>(
    conn: &mut Q,
    resource: &str,
    token: FencingToken,
) -> Result<(), MysqlFenceError> {
    conn.exec_drop(RAISE, (resource.as_bytes(), sql_token(token)))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_splits_into_its_statements() {
        let s = statements(MIGRATION);
        assert_eq!(s.len(), 4, "{s:#?}");
        assert!(s[0].starts_with("CREATE TABLE IF NOT EXISTS fence_high_water"));
        assert!(s[1].starts_with("CREATE TABLE IF NOT EXISTS fence_reset_log"));
        assert!(s[2].starts_with("CREATE OR REPLACE PROCEDURE fence_raise"));
        assert!(s[3].starts_with("CREATE OR REPLACE PROCEDURE fence_reset"));
        for st in &s {
            assert!(!st.ends_with("//") && !st.ends_with(';'), "{st}");
            assert!(!st.contains("DELIMITER"), "{st}");
        }
        assert!(s[2].ends_with("END"));
    }
}
