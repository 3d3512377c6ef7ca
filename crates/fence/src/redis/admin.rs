//! Reading a mark and its reset log, and lowering a mark that a mistaken token poisoned:
//! the Redis counterparts of [`crate::postgres::read_mark`] and friends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::Value;

use super::library::Call;
use super::write::unexpected;
use super::{RedisFence, RedisFenceError};
use crate::mark::{Mark, MarkReset, ResetGuard};
use crate::FencingToken;

/// Reads `resource`'s mark (`fence_mark`, sent as `FCALL_RO`, so a replica may answer);
/// `None` when it has none (no token was ever admitted).
///
/// # Errors
///
/// [`CorruptMark`](super::RedisFenceErrorKind::CorruptMark) when the mark key holds no
/// token; [`Unavailable`](super::RedisFenceErrorKind::Unavailable) or
/// [`Redis`](super::RedisFenceErrorKind::Redis) from Redis.
pub async fn read_mark<C: ConnectionLike + Send>(
    conn: &mut C,
    fence: &RedisFence,
    resource: &str,
) -> Result<Option<Mark>, RedisFenceError> {
    let key = fence.layout().mark_key(resource);
    let call = Call {
        name: "fence_mark",
        read_only: true,
        keys: &[key.as_bytes()],
        args: &[],
    };
    match fence.invoke(conn, resource, call).await? {
        Value::Nil => Ok(None),
        Value::Array(parts) => match parts.as_slice() {
            [token, updated_ms] => Ok(Some(Mark {
                token: token_of(resource, token)?,
                updated_at: time_of(resource, updated_ms)?,
            })),
            _ => Err(unexpected(resource, "fence_mark", &Value::Array(parts))),
        },
        other => Err(unexpected(resource, "fence_mark", &other)),
    }
}

/// The last `limit` resets of `resource`, newest first: `XREVRANGE` of its reset log
/// ([`KeyLayout::reset_log_key`](super::KeyLayout::reset_log_key)). A `limit` of 0 or
/// less reads none.
///
/// # Errors
///
/// [`CorruptMark`](super::RedisFenceErrorKind::CorruptMark) for an entry the fence did
/// not write; [`Unavailable`](super::RedisFenceErrorKind::Unavailable) or
/// [`Redis`](super::RedisFenceErrorKind::Redis) from Redis.
pub async fn read_resets<C: ConnectionLike + Send>(
    conn: &mut C,
    fence: &RedisFence,
    resource: &str,
    limit: i64,
) -> Result<Vec<MarkReset>, RedisFenceError> {
    if limit <= 0 {
        return Ok(Vec::new());
    }
    let entries: Value = redis::cmd("XREVRANGE")
        .arg(fence.layout().reset_log_key(resource))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(limit)
        .query_async(conn)
        .await
        .map_err(|e| RedisFenceError::from_redis(resource, e))?;
    let Value::Array(entries) = entries else {
        return Err(unexpected(resource, "XREVRANGE", &entries));
    };
    entries.iter().map(|e| reset_of(resource, e)).collect()
}

/// Lowers `resource`'s mark to `to` for `reason` with the lock unknown: [`reset_mark_guarded`]
/// with [`ResetGuard::LockUnknown`]. Returns the mark it replaced.
///
/// # Errors
///
/// As [`reset_mark_guarded`].
pub async fn reset_mark<C: ConnectionLike + Send>(
    conn: &mut C,
    fence: &RedisFence,
    resource: &str,
    to: FencingToken,
    reason: &str,
) -> Result<FencingToken, RedisFenceError> {
    reset_mark_guarded(conn, fence, resource, to, reason, &ResetGuard::LockUnknown).await
}

/// Lowers `resource`'s mark to `to` for `reason` with `fence_reset`, checked against
/// `guard`; returns the mark it replaced. The rules are those of the Postgres reset
/// ([`crate::postgres::reset_mark`]), enforced by the library in one atomic call:
///
/// - it only lowers, to a token you name, never to "no mark" (which would admit any
///   token); with [`ResetGuard::Lock`], `to` may not be below the lock's floor (its
///   newest grant), so every older holder keeps being refused;
/// - it needs a reason with a non-space character;
/// - it appends `old`, `new`, `reason`, `reset_by`, `lock` and `floor` to the resource's
///   reset log ([`read_resets`]) in the same call: no reset without its record.
///
/// `reset_by` is the ACL user of `conn`, read with `ACL WHOAMI` just before the call (a
/// function cannot read it: Redis forbids `ACL` and `CLIENT` in scripts). It is therefore
/// reported by the caller, not checked by Redis: a client calling `FCALL fence_reset`
/// itself writes what it likes there. Redis before 6.0 has no `ACL WHOAMI` and only the
/// user `default`, which is then recorded.
///
/// # Errors
///
/// - [`BadReset`](super::RedisFenceErrorKind::BadReset): an empty reason, `to` not below
///   the mark, or below the guard's floor;
/// - [`NoMark`](super::RedisFenceErrorKind::NoMark): the resource has no mark;
/// - [`Unavailable`](super::RedisFenceErrorKind::Unavailable) or
///   [`Redis`](super::RedisFenceErrorKind::Redis) from Redis.
pub async fn reset_mark_guarded<C: ConnectionLike + Send>(
    conn: &mut C,
    fence: &RedisFence,
    resource: &str,
    to: FencingToken,
    reason: &str,
    guard: &ResetGuard,
) -> Result<FencingToken, RedisFenceError> {
    let reset_by = whoami(conn, resource).await?;
    let (lock, floor) = match guard {
        ResetGuard::Lock { name, floor } => (name.as_str(), floor.to_string()),
        ResetGuard::LockUnknown => ("", String::new()),
    };
    let (mark, log) = (
        fence.layout().mark_key(resource),
        fence.layout().reset_log_key(resource),
    );
    let args = [
        to.to_string().into_bytes(),
        reason.as_bytes().to_vec(),
        reset_by.into_bytes(),
        lock.as_bytes().to_vec(),
        floor.into_bytes(),
    ];
    let call = Call {
        name: "fence_reset",
        read_only: false,
        keys: &[mark.as_bytes(), log.as_bytes()],
        args: &args,
    };
    let old = fence.invoke(conn, resource, call).await?;
    token_of(resource, &old)
}

/// The connection's ACL user (`ACL WHOAMI`); `default` on a server that predates ACLs.
async fn whoami<C: ConnectionLike + Send>(
    conn: &mut C,
    resource: &str,
) -> Result<String, RedisFenceError> {
    let reply: Result<String, _> = redis::cmd("ACL").arg("WHOAMI").query_async(conn).await;
    match reply {
        Ok(user) => Ok(user),
        // Redis 5: `ERR unknown command 'ACL'`; it has one user, `default`.
        Err(e)
            if e.code() == Some("ERR")
                && e.detail().is_some_and(|d| d.contains("unknown command")) =>
        {
            Ok("default".to_owned())
        }
        Err(e) => Err(RedisFenceError::from_redis(resource, e)),
    }
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn token_of(resource: &str, value: &Value) -> Result<FencingToken, RedisFenceError> {
    text(value)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| RedisFenceError::corrupt(resource, format!("{value:?} is not a token")))
}

fn time_of(resource: &str, value: &Value) -> Result<SystemTime, RedisFenceError> {
    text(value)
        .and_then(|t| t.parse::<u64>().ok())
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
        .ok_or_else(|| {
            RedisFenceError::corrupt(resource, format!("{value:?} is not a time in Unix ms"))
        })
}

/// One reset log entry: `[id, [field, value, ...]]`.
fn reset_of(resource: &str, entry: &Value) -> Result<MarkReset, RedisFenceError> {
    let bad = || {
        RedisFenceError::corrupt(
            resource,
            format!("reset log entry {entry:?} was not written by fence_reset"),
        )
    };
    let Value::Array(parts) = entry else {
        return Err(bad());
    };
    let [id, Value::Array(fields)] = parts.as_slice() else {
        return Err(bad());
    };
    let ms = text(id)
        .and_then(|id| id.split('-').next())
        .and_then(|ms| ms.parse::<u64>().ok())
        .ok_or_else(bad)?;
    let field = |name: &str| {
        fields
            .chunks(2)
            .find(|kv| text(&kv[0]) == Some(name))
            .and_then(|kv| kv.get(1))
            .and_then(text)
            .ok_or_else(bad)
    };
    let token = |name: &str| field(name)?.parse::<FencingToken>().map_err(|_| bad());
    let lock = match (field("lock")?, field("floor")?) {
        ("", "") => None,
        (name, floor) => Some((name.to_owned(), floor.parse().map_err(|_| bad())?)),
    };
    Ok(MarkReset {
        old: token("old")?,
        new: token("new")?,
        reason: field("reason")?.to_owned(),
        reset_by: field("reset_by")?.to_owned(),
        reset_at: UNIX_EPOCH + Duration::from_millis(ms),
        lock,
    })
}
