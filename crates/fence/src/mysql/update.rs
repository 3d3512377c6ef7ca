//! The folded form: the token check inside the `UPDATE` of a table with a token column.

use mysql_async::prelude::Queryable;
use mysql_async::{Params, Value};

use super::{sql_token, MysqlFenceError};
use crate::FencingToken;

/// An `UPDATE` of one row, fenced by the row's own token column.
///
/// For a table that carries the token of its last writer (default column `fence_token`,
/// `BIGINT NULL`, `NULL` meaning never fenced), the check is folded into the statement:
///
/// ```sql
/// UPDATE <table> SET <your assignments>, fence_token = ?
///  WHERE <key> = ? AND (fence_token IS NULL OR fence_token <= ?)
/// ```
///
/// MySQL's placeholders are positional, so your parameters (those of the assignments)
/// come first, then the token, the key and the token again: the helper appends the last
/// three. One statement, no mark table, no procedure: the `UPDATE` reads the latest
/// committed row and locks it exclusive at any isolation level, so the writers of one row
/// take turns and the row's token only rises. When it matches no row, one more query
/// (`SELECT <token column> … LOCK IN SHARE MODE`, which reads the latest committed row)
/// tells why: no row with the key, or a higher token.
///
/// # Privileges
///
/// The check lives in the writer's own table: the writer needs `UPDATE` (and `SELECT`)
/// on it, as for the write itself, and nothing on the fence's tables or procedures. No
/// stored function is involved, so no binary-log setting
/// (`log_bin_trust_function_creators`) applies, and the statement is deterministic for
/// statement-based replication. The row's token is a mark of its own, separate from
/// `fence_high_water`: fence a row with one form only.
///
/// The key column must be unique (a primary key): the update is of one row.
///
/// # Examples
///
/// ```no_run
/// use palisade_fence::mysql::FencedUpdate;
/// use palisade_fence::FencingToken;
///
/// # async fn example(mut conn: mysql_async::Conn, token: FencingToken) -> Result<(), palisade_fence::mysql::MysqlFenceError> {
/// let accounts = FencedUpdate::new("accounts", "id");
/// match accounts.execute(&mut conn, 7_i64, "balance = balance + ?", vec![100_i64.into()], token).await {
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
    /// An update of `table`, one row selected by `key_column = ?`.
    ///
    /// # Panics
    ///
    /// If a name is not a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, optionally
    /// database-qualified with one `.`): names are spliced into the SQL, so only
    /// identifiers the program itself chose are allowed.
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

    /// The `UPDATE` statement for the assignments `set` (to prepare it yourself): `set`'s
    /// own placeholders, then the token, the key, the token.
    pub fn sql(&self, set: &str) -> String {
        let (t, k, c) = (&self.table, &self.key_column, &self.token_column);
        format!("UPDATE {t} SET {set}, {c} = ? WHERE {k} = ? AND ({c} IS NULL OR {c} <= ?)")
    }

    /// Runs the update with `params` for `set`'s placeholders; returns the number of rows
    /// it matched (1; MySQL counts a row written with the values it had as matched, not
    /// changed, and so does this).
    ///
    /// Runs on any connection or transaction: alone, it is a transaction of its own.
    ///
    /// # Errors
    ///
    /// - [`RowMissing`](super::MysqlFenceErrorKind::RowMissing): no row has the key.
    /// - [`Stale`](super::MysqlFenceErrorKind::Stale): the row's token is above `token`;
    ///   [`MysqlFenceError::highest`] is the row's token. Nothing was written.
    /// - A database error otherwise (inside a transaction of yours, roll it back: MariaDB
    ///   keeps it open after an error).
    pub async fn execute<Q, K>(
        &self,
        conn: &mut Q,
        key: K,
        set: &str,
        params: Vec<Value>,
        token: FencingToken,
    ) -> Result<u64, MysqlFenceError>
    where
        Q: Queryable,
        K: Into<Value>,
    {
        let key: Value = key.into();
        let mut all = params;
        all.extend([
            sql_token(token).into(),
            key.clone(),
            sql_token(token).into(),
        ]);
        let result = conn
            .exec_iter(self.sql(set), Params::Positional(all))
            .await?;
        let n = result.affected_rows();
        result.drop_result().await?;
        if n > 0 {
            return Ok(n);
        }
        // Nothing changed: no row, a higher token, or a row written with the values it
        // had (MySQL counts changed rows). The locking read sees the latest committed row.
        let probe = format!(
            "SELECT {c} FROM {t} WHERE {k} = ? LOCK IN SHARE MODE",
            c = self.token_column,
            t = self.table,
            k = self.key_column
        );
        let row: Option<Option<i64>> = conn.exec_first(probe, (key,)).await?;
        match row {
            None => Err(MysqlFenceError::row_missing()),
            Some(Some(highest)) if highest > sql_token(token) => {
                let highest = FencingToken::try_from(highest).map_err(|_| {
                    MysqlFenceError::bad_value("the row's token column holds a negative value")
                })?;
                Err(MysqlFenceError::stale(token, highest))
            }
            // The row admits the token: the update matched it and wrote equal values.
            Some(_) => Ok(1),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_puts_the_callers_placeholders_first() {
        let u = FencedUpdate::new("app.accounts", "id").with_token_column("tok");
        assert_eq!(
            u.sql("balance = balance + ?"),
            "UPDATE app.accounts SET balance = balance + ?, tok = ? WHERE id = ? AND (tok IS NULL OR tok <= ?)"
        );
    }

    #[test]
    #[should_panic(expected = "not a plain SQL identifier")]
    fn a_name_that_is_not_an_identifier_is_refused() {
        let _ = FencedUpdate::new("accounts; DROP TABLE x", "id");
    }
}
