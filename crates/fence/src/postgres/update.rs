//! The folded form: the token check inside the `UPDATE` of a table with a token column.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, SimpleQueryMessage, Statement};

use super::FenceError;
use crate::FencingToken;

/// An `UPDATE` of one row, fenced by the row's own token column.
///
/// For a table that carries the token of its last writer (default column `fence_token`,
/// `bigint`, `NULL` meaning never fenced), the check is folded into the statement:
///
/// ```sql
/// UPDATE <table> SET <your assignments>, fence_token = $1
///  WHERE <key> = $2 AND (fence_token IS NULL OR fence_token <= $1)
/// ```
///
/// `$1` is the token and `$2` the key; your parameters start at `$3`. One statement, no
/// high-water row; the row lock of the `UPDATE` orders the writers of that row. When it
/// updates nothing, one more query tells why: no row with the key, or a higher token.
///
/// # Round trips
///
/// The first [`execute`](Self::execute) of each `set` learns the statement's parameter
/// types (two round trips: `PREPARE`, a read of `pg_prepared_statements` and `DEALLOCATE`
/// in one simple query, then the update); the types are kept in the `FencedUpdate` (and
/// its clones), and every later call sends parse, bind and execute in one message: one
/// round trip, no named statement left on the connection (so it runs behind a
/// transaction-mode pooler), but the server plans the statement every time. A parameter
/// of a type without a built-in OID (an enum, say) is learned with a named prepare
/// instead, which needs a session. The types are those of the first database it ran on: use one
/// `FencedUpdate` per database schema. For an update run many times on one connection,
/// [`prepare`](Self::prepare) it: the server then keeps the plan.
///
/// # Examples
///
/// ```no_run
/// use palisade_fence::{FencedUpdate, FencingToken};
///
/// # async fn example(client: tokio_postgres::Client, token: FencingToken) -> Result<(), palisade_fence::FenceError> {
/// let accounts = FencedUpdate::new("accounts", "id");
/// match accounts.execute(&client, &7_i64, "balance = balance + $3", &[&100_i64], token).await {
///     Ok(_) => {}
///     Err(e) if e.is_row_missing() => println!("no account 7"),
///     Err(e) if e.is_stale() => println!("refused, row has {:?}", e.highest()),
///     Err(e) => return Err(e),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct FencedUpdate {
    table: String,
    key_column: String,
    token_column: String,
    /// Parameter types of the statement of each `set`, learned by its first prepare.
    types: Arc<Mutex<HashMap<String, Arc<[Type]>>>>,
}

impl std::fmt::Debug for FencedUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedUpdate")
            .field("table", &self.table)
            .field("key_column", &self.key_column)
            .field("token_column", &self.token_column)
            .finish_non_exhaustive()
    }
}

/// Two updates are equal when they write the same table through the same columns (the
/// learned parameter types are a cache, not part of the value).
impl PartialEq for FencedUpdate {
    fn eq(&self, other: &Self) -> bool {
        (&self.table, &self.key_column, &self.token_column)
            == (&other.table, &other.key_column, &other.token_column)
    }
}

impl Eq for FencedUpdate {}

impl FencedUpdate {
    /// An update of `table`, one row selected by `key_column = $2`.
    ///
    /// # Panics
    ///
    /// If a name is not a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, optionally
    /// schema-qualified with one `.`): names are spliced into the SQL, so only identifiers
    /// the program itself chose are allowed.
    #[must_use]
    pub fn new(table: &str, key_column: &str) -> Self {
        FencedUpdate {
            table: identifier(table),
            key_column: identifier(key_column),
            token_column: "fence_token".to_owned(),
            types: Arc::default(),
        }
    }

    /// Uses `column` instead of `fence_token`.
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new).
    #[must_use]
    pub fn with_token_column(mut self, column: &str) -> Self {
        self.token_column = identifier(column);
        self.types = Arc::default();
        self
    }

    /// The `UPDATE` statement for the assignments `set` (to prepare it yourself).
    pub fn sql(&self, set: &str) -> String {
        let (t, k, c) = (&self.table, &self.key_column, &self.token_column);
        format!("UPDATE {t} SET {set}, {c} = $1 WHERE {k} = $2 AND ({c} IS NULL OR {c} <= $1)")
    }

    /// Runs the update; returns the number of rows updated (at least one).
    ///
    /// # Errors
    ///
    /// - [`FenceErrorKind::RowMissing`](super::FenceErrorKind::RowMissing): no row has the key.
    /// - [`FenceErrorKind::Stale`](super::FenceErrorKind::Stale): the row's token is above
    ///   `token`; [`FenceError::highest`] is the row's token.
    /// - A database error otherwise.
    pub async fn execute<C: GenericClient + Sync>(
        &self,
        client: &C,
        key: &(dyn ToSql + Sync),
        set: &str,
        params: &[&(dyn ToSql + Sync)],
        token: FencingToken,
    ) -> Result<u64, FenceError> {
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 2);
        all.push(&token);
        all.push(key);
        all.extend_from_slice(params);
        let sql = self.sql(set);
        let known = self
            .types
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(set)
            .cloned();
        let n = match known {
            Some(types) if types.len() == all.len() => {
                run_unnamed(client, &sql, &all, &types).await?
            }
            _ => match describe(client, &sql).await? {
                Some(types) => {
                    let types: Arc<[Type]> = types.into();
                    self.types
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(set.to_owned(), Arc::clone(&types));
                    run_unnamed(client, &sql, &all, &types).await?
                }
                None => {
                    // A parameter of a type without a built-in OID (an enum, a domain...):
                    // a named statement learns it, which needs a session (see `prepare`).
                    let statement = client.prepare(&sql).await?;
                    let n = client.execute(&statement, &all).await?;
                    self.types
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(set.to_owned(), statement.params().into());
                    n
                }
            },
        };
        let key_type = self
            .types
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(set)
            .and_then(|t| t.get(1).cloned());
        self.outcome(client, n, key, key_type, token).await
    }

    /// Prepares the update for the assignments `set` on `client`'s connection: the fast
    /// path for an update run many times on one connection (one round trip per call, and
    /// the server keeps the plan instead of planning every call).
    ///
    /// # Errors
    ///
    /// The database error of the prepare (say, an unknown column in `set`).
    pub async fn prepare<C: GenericClient + Sync>(
        &self,
        client: &C,
        set: &str,
    ) -> Result<PreparedFencedUpdate, FenceError> {
        let statement = client.prepare(&self.sql(set)).await?;
        Ok(PreparedFencedUpdate {
            update: self.clone(),
            statement,
        })
    }

    /// `Ok(n)` for `n > 0` rows updated; otherwise one more query tells why none was.
    async fn outcome<C: GenericClient + Sync>(
        &self,
        client: &C,
        n: u64,
        key: &(dyn ToSql + Sync),
        key_type: Option<Type>,
        token: FencingToken,
    ) -> Result<u64, FenceError> {
        if n > 0 {
            return Ok(n);
        }
        let probe = format!(
            "SELECT {} FROM {} WHERE {} = $1",
            self.token_column, self.table, self.key_column
        );
        // Unnamed when the key's type is known: nothing left on the server session.
        let row = match key_type {
            Some(ty) => client.query_typed_opt(&probe, &[(key, ty)]).await?,
            None => client.query_opt(probe.as_str(), &[key]).await?,
        };
        match row {
            None => Err(FenceError::row_missing()),
            Some(row) => {
                let highest: Option<FencingToken> = row.try_get(0)?;
                // A NULL or lower token here means a concurrent writer changed the row
                // between the two statements; report it as stale against what we read.
                Err(FenceError::stale(token, highest.unwrap_or(token)))
            }
        }
    }
}

/// A [`FencedUpdate`] prepared on one connection ([`FencedUpdate::prepare`]).
///
/// Like a tokio-postgres `Statement`, it belongs to the server session it was prepared
/// on: on another connection, or behind a transaction-mode pooler, the server answers
/// "prepared statement does not exist" (SQLSTATE `26000`, kind
/// [`NeedsSession`](super::FenceErrorKind::NeedsSession)) and nothing is written.
#[derive(Debug, Clone)]
pub struct PreparedFencedUpdate {
    update: FencedUpdate,
    statement: Statement,
}

impl PreparedFencedUpdate {
    /// Runs the update with `key` as `$2` and `params` from `$3`; one round trip. Returns
    /// the number of rows updated (at least one).
    ///
    /// # Errors
    ///
    /// As [`FencedUpdate::execute`].
    pub async fn execute<C: GenericClient + Sync>(
        &self,
        client: &C,
        key: &(dyn ToSql + Sync),
        params: &[&(dyn ToSql + Sync)],
        token: FencingToken,
    ) -> Result<u64, FenceError> {
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 2);
        all.push(&token);
        all.push(key);
        all.extend_from_slice(params);
        let n = client.execute(&self.statement, &all).await?;
        let key_type = self.statement.params().get(1).cloned();
        self.update.outcome(client, n, key, key_type, token).await
    }

    /// The prepared statement.
    pub fn statement(&self) -> &Statement {
        &self.statement
    }
}

/// Runs `sql` as an unnamed statement (parse, bind and execute in one message): one round
/// trip, nothing left on the server session. Returns the rows affected.
async fn run_unnamed<C: GenericClient + Sync>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    types: &[Type],
) -> Result<u64, tokio_postgres::Error> {
    let rows = client
        .query_typed_raw(sql, params.iter().copied().zip(types.iter().cloned()))
        .await?;
    let mut rows = std::pin::pin!(rows);
    // An UPDATE without RETURNING yields no rows; drain to reach the count.
    while rows.next().await.transpose()?.is_some() {}
    Ok(rows.rows_affected().unwrap_or(0))
}

/// A name for [`describe`]'s statement, unique in this process.
static DESCRIBE: AtomicU64 = AtomicU64::new(0);

/// The parameter types the server infers for `sql`, learned without leaving session state
/// behind: `PREPARE`, a read of `pg_prepared_statements` and `DEALLOCATE` in one simple
/// query, which is one implicit transaction (or part of the caller's), so a
/// transaction-mode pooler runs all three on one server session. `None` when a type has
/// no built-in OID that tokio-postgres knows.
async fn describe<C: GenericClient + Sync>(
    client: &C,
    sql: &str,
) -> Result<Option<Vec<Type>>, tokio_postgres::Error> {
    let name = format!(
        "palisade_fence_describe_{}_{}",
        std::process::id(),
        DESCRIBE.fetch_add(1, Ordering::Relaxed)
    );
    let script = format!(
        "PREPARE {name} AS {sql}; \
         SELECT parameter_types::oid[]::text FROM pg_prepared_statements WHERE name = '{name}'; \
         DEALLOCATE {name}"
    );
    let messages = client.client().simple_query(&script).await?;
    let oids = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    let Some(oids) = oids else {
        return Ok(None);
    };
    let inner = oids.trim_start_matches('{').trim_end_matches('}');
    if inner.is_empty() {
        return Ok(Some(Vec::new()));
    }
    Ok(inner
        .split(',')
        .map(|oid| oid.trim().parse::<u32>().ok().and_then(Type::from_oid))
        .collect())
}

fn identifier(name: &str) -> String {
    let part_ok = |p: &str| {
        let mut b = p.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    assert!(
        (1..=2).contains(&parts.len()) && parts.iter().all(|p| part_ok(p)),
        "not a plain SQL identifier: {name:?}"
    );
    name.to_owned()
}
