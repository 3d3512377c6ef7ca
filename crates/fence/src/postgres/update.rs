//! The folded form: the token check inside the `UPDATE` of a table with a token column.

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedUpdate {
    table: String,
    key_column: String,
    token_column: String,
}

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
        let n = client.execute(self.sql(set).as_str(), &all).await?;
        if n > 0 {
            return Ok(n);
        }
        let probe = format!("SELECT {} FROM {} WHERE {} = $1", self.token_column, self.table, self.key_column);
        match client.query_opt(probe.as_str(), &[key]).await? {
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
