//! Conditional writes on PostgreSQL: the check and the write in one transaction.
//!
//! A fenced write is only safe when the token check and the write are one atomic step.
//! Here that step is a transaction that begins with the raise, `SELECT
//! palisade_fence.fence_raise(resource, token)`: a PL/pgSQL function (created by
//! [`migrate`] in the schema [`SCHEMA`]) that reads the resource's mark in
//! `palisade_fence.fence_high_water` and
//!
//! - refuses a token below the mark, writing nothing;
//! - for a token equal to the mark (a holder writing again under one hold) takes the
//!   resource's lock *shared* and reads the mark again: no write and no WAL, and several
//!   transactions with that token may hold the lock at once;
//! - for a newer token (or a resource's first) takes the lock *exclusive*, then writes
//!   the row only if its token is still not above this one (`UPDATE … WHERE token <=
//!   $token` on the existing row; `INSERT … ON CONFLICT (resource) DO UPDATE … WHERE
//!   fence_high_water.token <= EXCLUDED.token` when there is none).
//!
//! The resource's lock is a transaction-scoped advisory lock keyed by a hash of its name
//! (`pg_advisory_xact_lock(1885432937, hashtext(resource))`; a hash collision between two
//! resources only makes them wait for each other). The function's statements are planned
//! once per connection (PL/pgSQL keeps their plans), so a caller sends one short
//! statement. Postgres holds the lock until the transaction ends, and serves conflicting
//! requests in the order they arrive, so:
//!
//! - a raise waits for every in-flight transaction that was admitted with an equal or
//!   older token (each holds the lock), and a transaction with the old token that arrives
//!   while a raise holds or awaits the lock queues behind it, then reads the mark it
//!   committed and is refused;
//! - therefore the committed transactions of one resource, in commit order, carry
//!   non-decreasing tokens, and a refused writer leaves nothing behind.
//!
//! The argument: the mark only changes under the exclusive lock. Let A (token a) and B
//! (token b > a) both commit, and R be the transaction that raised the mark to b (B
//! itself, or an earlier raiser whose committed mark B read). After its lock was granted
//! A found the mark no higher than a: on the shared path by a read with a snapshot taken
//! after the grant, on the exclusive path by the `WHERE` of its write (the `UPDATE`'s or
//! the upsert's), which checks the latest committed row; R held the lock exclusive, so
//! the two spans do not overlap. Had R's come first, R would have committed before A's
//! lock was granted (Postgres releases a transaction's locks after its commit is visible)
//! and A would have read b and been refused. So A's came first: A committed before R was
//! granted the lock, hence before R committed, hence before B.
//! Writers with one token run side by side and commit in any order; their tokens are
//! equal. The rule needs every writer of marks to raise through `fence_raise`:
//! [`PostgresStore`](crate::PostgresStore) does; an earlier version of this crate (which
//! upserted without the lock) must not write the same database at the same time, so
//! upgrading from one is not a rolling upgrade: stop every writer of the old version
//! before the first of the new one starts.
//!
//! The reads after the lock see the latest committed mark at the default `READ COMMITTED`
//! level. At `REPEATABLE READ` or `SERIALIZABLE` a read sees the transaction's snapshot,
//! so there every admitted token takes the lock exclusive and rewrites the row, and a
//! mark committed after the snapshot shows up as a serialization failure instead:
//! [`FenceError::is_retryable`]; so does a second writer with the same token whose
//! snapshot predates the first one's rewrite of the row (there, writers with one token
//! take turns, and one of them retries). A transaction that fences two resources (a nested
//! [`begin_fenced`] on a `Transaction`) can deadlock with one that takes them in the other
//! order, as with any two locks; Postgres reports it as a retryable
//! [`Deadlock`](FenceErrorKind::Deadlock).
//!
//! Three forms:
//! - [`fenced_transaction`] (or [`FencedTransaction::begin`] to drive the transaction
//!   yourself): any statements, on any tables, guarded by the resource's high-water row.
//!   `BEGIN` and the raise go in one flight, then each statement of the body and `COMMIT`
//!   take a round trip each, as in the same transaction without the fence: the body only
//!   starts once the raise admitted the token. [`begin_fenced`] fences a transaction (or
//!   a savepoint of one) that you begin through tokio-postgres, at one round trip more.
//! - [`fenced_execute`]: the same guard for prepared statements that do not depend on each
//!   other's results, in one round trip (`BEGIN`, raise, statements, `COMMIT` pipelined;
//!   a refused token makes the raise fail, which aborts the rest).
//! - [`FencedUpdate`]: for a table that carries its own `fence_token` column, the check is
//!   folded into the `UPDATE` itself (`… AND fence_token <= $token`), one statement and no
//!   high-water row; zero rows is told apart as [`FenceErrorKind::RowMissing`] or
//!   [`FenceErrorKind::Stale`].
//!
//! # Behind a connection pooler
//!
//! A transaction-mode pooler (PgBouncer's `pool_mode = transaction`) runs each
//! transaction on whichever server connection is free, so session state (a named
//! prepared statement, a `SET`) does not follow the client from one transaction to the
//! next. What each form needs:
//!
//! | form | behind a transaction-mode pooler |
//! |---|---|
//! | [`PostgresStore`](crate::PostgresStore) | works: unnamed statements, each its own transaction; with [`with_prepared_statements`](crate::PostgresStore::with_prepared_statements) it needs a session |
//! | [`fenced_transaction`], [`FencedTransaction`], [`begin_fenced`] | works: `BEGIN`, the raise (unnamed) and the body are one transaction; a body's own statements run inside it |
//! | [`FencedUpdate::execute`] | works: unnamed statements; the parameter types are learned once with `PREPARE`, a catalog read and `DEALLOCATE` in one simple query |
//! | [`fenced_execute`] | needs a session when its statements are prepared on the client (they are named) |
//! | [`PreparedFence`], [`PreparedFencedUpdate`] | need a session: the prepared statement lives in the server connection it was prepared on |
//!
//! *Needs a session* means: connect those clients directly to Postgres, or through a
//! session-mode pool (PgBouncer `pool_mode = session`, or a second PgBouncer database
//! entry with `pool_mode=session` for them). Misconfigured, a prepared form usually fails
//! at once with [`FenceErrorKind::NeedsSession`] (SQLSTATE `26000`, statement missing, or
//! `42P05`, name taken by another client's statement), not retryable, and writes
//! nothing: the transaction it was part of is rolled back. But a server connection that
//! holds another client's statement under the same name runs that statement in its
//! place, which a prepared form cannot tell from its own (tokio-postgres names statements
//! `s0`, `s1`, … in every process): the misconfiguration is not always caught, so never
//! point the prepared forms at a transaction-mode pooler. (`PostgresStore`'s prepared
//! statements sign their answers, so it does catch that case: see
//! [`with_prepared_statements`](crate::PostgresStore::with_prepared_statements).)
//!
//! Run [`migrate`] once, as the fence's owner, to create the schema [`SCHEMA`] with
//! `fence_high_water` and the functions ([`MIGRATION`] is the SQL, for your own migration
//! tool). Writers need only `USAGE` on the schema and `EXECUTE` on the raise functions: the
//! functions are `SECURITY DEFINER`, so a writer cannot write a mark but through them, and
//! cannot lower one at all. `docs/sql-api.md` has the roles and grants. A database migrated
//! by an earlier version (tables and functions in `public`) is moved into the schema by
//! the next [`migrate`]; until then the raise fails with SQLSTATE `3F000` (no such
//! schema), as a [`Database`](FenceErrorKind::Database) error.
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

mod admin;
mod error;
mod pipeline;
mod transaction;
mod update;

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

pub use crate::mark::{Mark, MarkReset, ResetGuard};
pub use admin::{read_mark, read_resets, reset_mark, reset_mark_guarded};
pub(crate) use error::{is_retryable, needs_session};
pub use error::{FenceError, FenceErrorKind};
pub use pipeline::{fenced_execute, FencedStatement, PreparedFence};
pub use transaction::{fenced_transaction, FencedTransaction, TxFuture};
pub use update::{FencedUpdate, PreparedFencedUpdate};

use crate::store::Raise;
use crate::FencingToken;

/// The schema the fence's tables and functions live in. Every call names it
/// (`palisade_fence.fence_raise(...)`), so no function of the same name in another schema
/// is ever reached.
pub const SCHEMA: &str = "palisade_fence";

/// The SQL of this crate's migration, `0007_fence_schema.sql`: the schema
/// [`SCHEMA`], owned by the role that runs it, with the mark table `fence_high_water`,
/// the reset log `fence_reset_log`, the raise functions (`fence_raise`,
/// `fence_raise_or_abort`, `fence_raise_many`, `fence_decide`, `fence_decide_many`) and
/// `fence_reset`, each `SECURITY DEFINER` with `search_path` pinned to `pg_catalog,
/// pg_temp`; `PUBLIC` gets no privilege on any of them. It brings a database of any
/// earlier version (whose objects are in the current schema, usually `public`) up to
/// date: moves the tables, drops and recreates the functions, and grants the raise
/// functions to the roles that could write the old mark table (each step a `NOTICE`).
/// Idempotent. The roles and grants to give are in `docs/sql-api.md`.
pub const MIGRATION: &str = include_str!("../../migrations/0007_fence_schema.sql");

/// The raise: returns the mark as the transaction leaves it (the token when admitted).
const RAISE: &str = "SELECT palisade_fence.fence_raise($1, $2)";
const MARK: &str = "SELECT token FROM palisade_fence.fence_high_water WHERE resource = $1";

/// Runs [`MIGRATION`]: creates (or brings up to date) the schema [`SCHEMA`], its tables
/// and functions, in one transaction, under a transaction-scoped advisory lock so that
/// replicas starting together take turns.
///
/// Run it as the fence's owner (the role `docs/sql-api.md` calls `palisade_fence_owner`,
/// or a login that has done `SET ROLE` to it): the owner of everything it creates. A writer,
/// which holds only `EXECUTE` on the raise functions, does not migrate.
///
/// # Errors
///
/// - [`FenceErrorKind::ForeignObject`] (SQLSTATE `PF002`) when the migration finds an
///   object it did not create: the schema owned by another role (so also when the caller
///   is not the owner), another role's object in it, a function it does not define there,
///   or a table or function of the fence's names owned by another role in the current
///   schema (where earlier versions put them). The message names it; nothing is changed.
/// - Otherwise the database error, as a [`FenceError`] of kind `Database` or `Closed`.
pub async fn migrate<C: GenericClient + Send + Sync>(client: &mut C) -> Result<(), FenceError> {
    let tx = client.transaction().await?;
    // 0x70616c69 = "pali": one fixed key for this migration.
    tx.batch_execute("SELECT pg_advisory_xact_lock(1885432937)")
        .await?;
    tx.batch_execute(MIGRATION).await?;
    tx.commit().await?;
    Ok(())
}

/// The compare-and-raise: one statement, one round trip (typed parameters, no prepare;
/// the function's own statements keep their plans on the connection).
pub(crate) async fn raise<C: GenericClient + Sync>(
    client: &C,
    resource: &str,
    token: FencingToken,
) -> Result<Raise, tokio_postgres::Error> {
    let row = client
        .query_typed_one(RAISE, &[(&resource, Type::TEXT), (&token, Type::INT8)])
        .await?;
    Ok(verdict(token, row.try_get(0)?))
}

/// The verdict from the mark `fence_raise` returned: admitted only when it is the token
/// itself. Anything else (a higher mark; no value, which the function never returns for
/// a valid call) refuses, which is always safe.
pub(crate) fn verdict(token: FencingToken, mark: Option<FencingToken>) -> Raise {
    match mark {
        Some(mark) if mark == token => Raise::Admitted,
        Some(highest) => Raise::Stale { highest },
        None => Raise::Stale { highest: token },
    }
}

/// Begins a tokio-postgres transaction on `client` and raises `resource`'s high-water row
/// to `token`.
///
/// Two round trips: `BEGIN`, then the raise (tokio-postgres hands out a `Transaction`
/// only once `BEGIN` has answered). [`FencedTransaction::begin`] sends both in one flight
/// but needs a plain `Client`; this one takes any [`GenericClient`], a `Transaction`
/// included (the fence then runs in a savepoint). On success the transaction holds the
/// resource's lock (exclusive if it raised the mark, shared if `token` equals the mark):
/// run your statements on it and commit (dropping it rolls back). A raise by a newer token
/// waits until then; writers with the same token do not wait for each other.
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
