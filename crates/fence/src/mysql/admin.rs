//! Reading a mark, and lowering one that a mistaken token poisoned.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::Queryable;

use super::{sql_token, MysqlFenceError};
use crate::mark::{Mark, MarkReset, ResetGuard};
use crate::FencingToken;

/// `updated_at` and `reset_at` are UTC `DATETIME(6)`s; this reads them as microseconds
/// since the Unix epoch, whatever the session's time zone.
const READ: &str = "SELECT token, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at) \
     FROM fence_high_water WHERE resource = ?";
const RESET: &str = "CALL fence_reset(?, ?, ?, ?, ?)";
const RESETS: &str = "SELECT old_token, new_token, reason, reset_by, \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', reset_at), lock_key, lock_floor \
     FROM fence_reset_log WHERE resource = ? ORDER BY id DESC LIMIT ?";

/// One row of [`RESETS`].
type ResetRow = (i64, i64, String, String, i64, Option<String>, Option<i64>);

/// Reads `resource`'s mark from `fence_high_water`; `None` when it has none (no token was
/// ever admitted). A plain read: inside a `REPEATABLE READ` transaction it sees that
/// transaction's snapshot.
///
/// Needs `SELECT` on `fence_high_water` (the fence's owner, or an account granted it).
///
/// # Errors
///
/// The database error (for example 1146, the table does not exist: run
/// [`migrate`](super::migrate); 1142, `SELECT` denied).
pub async fn read_mark<Q: Queryable>(
    conn: &mut Q,
    resource: &str,
) -> Result<Option<Mark>, MysqlFenceError> {
    let row: Option<(i64, i64)> = conn.exec_first(READ, (resource.as_bytes(),)).await?;
    Ok(match row {
        Some((token, micros)) => Some(Mark {
            token: token_of(token)?,
            updated_at: time_of(micros),
        }),
        None => None,
    })
}

/// The last `limit` resets of `resource`, newest first.
///
/// Needs `SELECT` on `fence_reset_log`.
///
/// # Errors
///
/// The database error.
pub async fn read_resets<Q: Queryable>(
    conn: &mut Q,
    resource: &str,
    limit: i64,
) -> Result<Vec<MarkReset>, MysqlFenceError> {
    let rows: Vec<ResetRow> = conn
        .exec(RESETS, (resource.as_bytes(), limit.max(0)))
        .await?;
    rows.into_iter()
        .map(|(old, new, reason, reset_by, micros, lock_key, floor)| {
            Ok(MarkReset {
                old: token_of(old)?,
                new: token_of(new)?,
                reason,
                reset_by,
                reset_at: time_of(micros),
                lock: match (lock_key, floor) {
                    (Some(name), Some(floor)) => Some((name, token_of(floor)?)),
                    _ => None,
                },
            })
        })
        .collect()
}

/// Lowers `resource`'s mark to `to` for `reason` with the lock that guards it unknown
/// ([`reset_mark_guarded`] with [`ResetGuard::LockUnknown`]: unchecked against any
/// lock, and logged so); returns the mark it replaced.
///
/// # Errors
///
/// As [`reset_mark_guarded`].
pub async fn reset_mark<Q: Queryable>(
    conn: &mut Q,
    resource: &str,
    to: FencingToken,
    reason: &str,
) -> Result<FencingToken, MysqlFenceError> {
    reset_mark_guarded(conn, resource, to, reason, &ResetGuard::LockUnknown).await
}

/// Lowers `resource`'s mark to `to` for `reason`, with the procedure `fence_reset`;
/// returns the mark it replaced.
///
/// A mistaken request with a huge token (say an epoch-1 token on an epoch-0 system)
/// leaves a mark that refuses every real token. A reset mends it, and is built so that it
/// cannot quietly re-admit a stale writer:
///
/// - it only lowers, to a token you name: never to "no mark", which would admit any
///   token. With [`ResetGuard::Lock`], a `to` below that lock's floor (its newest grant)
///   is refused, so every older holder keeps being refused;
/// - it locks the resource's row, as a raise does, so it waits for the fenced
///   transactions in flight and every later writer sees the new mark;
/// - it needs a non-empty reason and writes a row to `fence_reset_log` (old and new mark,
///   reason, the lock and its floor, `USER()` of the session, time) in the same
///   transaction: no reset without its record. Called outside a transaction, the
///   procedure makes one of its own; inside yours, the reset commits with it.
///
/// The account needs `EXECUTE` on `fence_reset` only.
///
/// # Errors
///
/// - [`BadReset`](super::MysqlFenceErrorKind::BadReset) (SQLSTATE `22023`): an empty
///   reason, `to` not below the mark, or below the guard's floor.
/// - [`NoMark`](super::MysqlFenceErrorKind::NoMark) (SQLSTATE `P0002`): the resource has
///   no mark.
/// - A database error otherwise (1370: `EXECUTE` denied).
pub async fn reset_mark_guarded<Q: Queryable>(
    conn: &mut Q,
    resource: &str,
    to: FencingToken,
    reason: &str,
    guard: &ResetGuard,
) -> Result<FencingToken, MysqlFenceError> {
    let (lock, floor) = match guard {
        ResetGuard::Lock { name, floor } => (Some(name.as_str()), Some(sql_token(*floor))),
        ResetGuard::LockUnknown => (None, None),
    };
    let old: Option<i64> = conn
        .exec_first(
            RESET,
            (resource.as_bytes(), sql_token(to), reason, lock, floor),
        )
        .await?;
    match old {
        Some(old) => token_of(old),
        None => Err(MysqlFenceError::bad_value(
            "fence_reset returned no old mark: is fence_reset from this crate's migration?",
        )),
    }
}

fn token_of(value: i64) -> Result<FencingToken, MysqlFenceError> {
    FencingToken::try_from(value)
        .map_err(|_| MysqlFenceError::bad_value("the fence's tables hold a negative token"))
}

fn time_of(micros: i64) -> SystemTime {
    if micros >= 0 {
        UNIX_EPOCH + Duration::from_micros(micros.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    }
}
