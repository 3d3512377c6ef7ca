//! Reading a mark, and lowering one that a mistaken token poisoned.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use super::FenceError;
use crate::mark::{Mark, MarkReset, ResetGuard};
use crate::FencingToken;

const READ: &str =
    "SELECT token, updated_at FROM palisade_fence.fence_high_water WHERE resource = $1";
const RESET: &str = "SELECT palisade_fence.fence_reset($1, $2, $3, $4, $5)";
const RESETS: &str =
    "SELECT old_token, new_token, reason, reset_by, reset_at, lock_key, lock_floor \
     FROM palisade_fence.fence_reset_log WHERE resource = $1 ORDER BY id DESC LIMIT $2";

/// Reads `resource`'s mark; `None` when it has none (no token was ever admitted).
///
/// # Errors
///
/// The database error (for example `fence_high_water` does not exist: run
/// [`migrate`](crate::migrate)).
pub async fn read_mark<C: GenericClient + Sync>(
    client: &C,
    resource: &str,
) -> Result<Option<Mark>, FenceError> {
    let row = client
        .query_typed_opt(READ, &[(&resource, Type::TEXT)])
        .await?;
    Ok(match row {
        Some(row) => Some(Mark {
            token: row.try_get(0)?,
            updated_at: row.try_get(1)?,
        }),
        None => None,
    })
}

/// The last `limit` resets of `resource`, newest first.
///
/// # Errors
///
/// The database error.
pub async fn read_resets<C: GenericClient + Sync>(
    client: &C,
    resource: &str,
    limit: i64,
) -> Result<Vec<MarkReset>, FenceError> {
    let rows = client
        .query_typed(
            RESETS,
            &[(&resource, Type::TEXT), (&limit.max(0), Type::INT8)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(MarkReset {
                old: row.try_get(0)?,
                new: row.try_get(1)?,
                reason: row.try_get(2)?,
                reset_by: row.try_get(3)?,
                reset_at: row.try_get(4)?,
                lock: match (row.try_get::<_, Option<String>>(5)?, row.try_get(6)?) {
                    (Some(name), Some(floor)) => Some((name, floor)),
                    _ => None,
                },
            })
        })
        .collect()
}

/// Lowers `resource`'s mark to `to` for `reason`, with `palisade_fence.fence_reset` (see [`MIGRATION`](crate::MIGRATION));
/// returns the mark it replaced.
///
/// A mistaken request with a huge token (say an epoch-1 token on an epoch-0 system)
/// leaves a mark that refuses every real token. A reset mends it, and is built so that it
/// cannot quietly re-admit a stale writer:
///
/// - it only lowers, to a token you name: never to "no mark", which would admit any
///   token. With the lock that guards the resource known, use [`reset_mark_guarded`]
///   with [`ResetGuard::Lock`]: a `to` below that lock's newest grant is refused, so every
///   older holder keeps being refused (each grant's token is above every earlier one).
///   This function is [`reset_mark_guarded`] with [`ResetGuard::LockUnknown`]: unchecked,
///   and logged so;
/// - it takes the resource's lock exclusive, as a raise does, so it waits for the fenced
///   transactions in flight and every later writer sees the new mark;
/// - it needs a non-empty reason and writes a row to `fence_reset_log` (old and new
///   mark, reason, the lock and its floor, database role, time) in the same transaction: no reset without its
///   record. `palisade fence reset` also records it in the audit trail.
///
/// A [`PostgresStore`](crate::PostgresStore) with a reject cache in another process keeps
/// refusing tokens below the old mark until it restarts (refusing more, never less).
///
/// # Errors
///
/// - [`FenceErrorKind::BadReset`](super::FenceErrorKind::BadReset): an empty reason, or
///   `to` not below the mark (SQLSTATE `22023`).
/// - [`FenceErrorKind::NoMark`](super::FenceErrorKind::NoMark): the resource has no mark
///   (SQLSTATE `P0002`).
/// - A database error otherwise.
pub async fn reset_mark<C: GenericClient + Sync>(
    client: &C,
    resource: &str,
    to: FencingToken,
    reason: &str,
) -> Result<FencingToken, FenceError> {
    reset_mark_guarded(client, resource, to, reason, &ResetGuard::LockUnknown).await
}

/// [`reset_mark`], checked against the lock that guards the resource: refused unless `to`
/// is at or above `guard`'s floor, and logged with the lock and its floor
/// ([`ResetGuard::LockUnknown`]: unchecked, logged as such).
///
/// # Errors
///
/// As [`reset_mark`]; [`FenceErrorKind::BadReset`](super::FenceErrorKind::BadReset) also
/// for `to` below the floor (SQLSTATE `22023`).
pub async fn reset_mark_guarded<C: GenericClient + Sync>(
    client: &C,
    resource: &str,
    to: FencingToken,
    reason: &str,
    guard: &ResetGuard,
) -> Result<FencingToken, FenceError> {
    let (lock, floor) = match guard {
        ResetGuard::Lock { name, floor } => (Some(name.as_str()), Some(*floor)),
        ResetGuard::LockUnknown => (None, None),
    };
    let row = client
        .query_typed_one(
            RESET,
            &[
                (&resource, Type::TEXT),
                (&to, Type::INT8),
                (&reason, Type::TEXT),
                (&lock, Type::TEXT),
                (&floor, Type::INT8),
            ],
        )
        .await?;
    Ok(row.try_get(0)?)
}
