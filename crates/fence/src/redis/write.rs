//! The fenced writes: the token check and the write in one call of the library.

use redis::aio::ConnectionLike;
use redis::{ToRedisArgs, Value};

use super::library::Call;
use super::{RedisFence, RedisFenceError};
use crate::FencingToken;

impl RedisFence {
    /// `fence_raise`: raises `resource`'s mark to `token` if `token` is at least the mark
    /// (or the resource has none); returns whether the mark rose (`false`: it equals
    /// `token` already). Writes no data: this is the check of [`RedisStore`](crate::RedisStore).
    ///
    /// # Errors
    ///
    /// [`Stale`](super::RedisFenceErrorKind::Stale) with the mark when `token` is below
    /// it; [`Unavailable`](super::RedisFenceErrorKind::Unavailable) and the others of
    /// [`RedisFenceErrorKind`](super::RedisFenceErrorKind) as they apply.
    pub async fn raise<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
    ) -> Result<bool, RedisFenceError> {
        let reply = self
            .fenced(conn, resource, "fence_raise", &[], token, Vec::new())
            .await?;
        int(resource, "fence_raise", reply).map(|n| n == 1)
    }

    /// `fenced_set`: `SET key value` if `token` is at least `resource`'s mark, which it
    /// then raises to `token`. `key` must be in the mark's Redis Cluster slot under a
    /// cluster (start it with [`KeyLayout::hash_tag`](super::KeyLayout::hash_tag)).
    ///
    /// # Errors
    ///
    /// [`Stale`](super::RedisFenceErrorKind::Stale) with the mark when `token` is below
    /// it, and nothing is written; [`BadArguments`](super::RedisFenceErrorKind::BadArguments)
    /// when `key` is the mark key; Redis's refusal of the `SET`
    /// ([`Redis`](super::RedisFenceErrorKind::Redis)), with nothing written;
    /// [`Unavailable`](super::RedisFenceErrorKind::Unavailable).
    pub async fn set<C, K, V>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
        key: K,
        value: V,
    ) -> Result<(), RedisFenceError>
    where
        C: ConnectionLike + Send,
        K: ToRedisArgs,
        V: ToRedisArgs,
    {
        let key = one(key);
        self.fenced(
            conn,
            resource,
            "fenced_set",
            &[&key],
            token,
            vec![one(value)],
        )
        .await
        .map(drop)
    }

    /// `fenced_hset`: `HSET key field value [field value ...]` under the check, as
    /// [`set`](Self::set); returns the number of fields added (HSET's reply). An empty
    /// `fields` is refused before anything is sent.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set) (`WRONGTYPE` when `key` is not a hash, with nothing
    /// written); [`BadArguments`](super::RedisFenceErrorKind::BadArguments) for no fields.
    pub async fn hset<C, K, F, V>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
        key: K,
        fields: &[(F, V)],
    ) -> Result<u64, RedisFenceError>
    where
        C: ConnectionLike + Send,
        K: ToRedisArgs,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let key = one(key);
        let mut args = Vec::with_capacity(2 * fields.len());
        for (f, v) in fields {
            f.write_redis_args(&mut args);
            v.write_redis_args(&mut args);
        }
        if args.is_empty() {
            return Err(RedisFenceError::bad_arguments(
                resource,
                "fenced_hset takes at least one field",
            ));
        }
        let reply = self
            .fenced(conn, resource, "fenced_hset", &[&key], token, args)
            .await?;
        int(resource, "fenced_hset", reply).map(|n| n.max(0) as u64)
    }

    /// `fenced_del`: `DEL key [key ...]` under the check, as [`set`](Self::set); returns
    /// the number of keys removed. An empty `keys` is refused before anything is sent.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set); [`BadArguments`](super::RedisFenceErrorKind::BadArguments)
    /// for no keys.
    pub async fn del<C, K>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
        keys: &[K],
    ) -> Result<u64, RedisFenceError>
    where
        C: ConnectionLike + Send,
        K: ToRedisArgs,
    {
        let owned: Vec<Vec<u8>> = keys.iter().map(one).collect();
        if owned.is_empty() {
            return Err(RedisFenceError::bad_arguments(
                resource,
                "fenced_del takes at least one key",
            ));
        }
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let reply = self
            .fenced(conn, resource, "fenced_del", &refs, token, Vec::new())
            .await?;
        int(resource, "fenced_del", reply).map(|n| n.max(0) as u64)
    }

    /// `fenced_incrby`: `INCRBY key delta` under the check, as [`set`](Self::set);
    /// returns the value after the increment.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set) (Redis refuses a value that is not an integer, or an
    /// overflow, with nothing written).
    pub async fn incrby<C, K>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
        key: K,
        delta: i64,
    ) -> Result<i64, RedisFenceError>
    where
        C: ConnectionLike + Send,
        K: ToRedisArgs,
    {
        let key = one(key);
        let reply = self
            .fenced(
                conn,
                resource,
                "fenced_incrby",
                &[&key],
                token,
                vec![one(delta)],
            )
            .await?;
        int(resource, "fenced_incrby", reply)
    }

    /// `fenced_call`: runs `commands` in order after the check, in the same call; returns
    /// each command's reply. The mark is raised before the commands run. A command that
    /// Redis refuses ends the call with [`Redis`](super::RedisFenceErrorKind::Redis):
    /// the commands before it stay applied (Redis has no rollback) and the mark raised.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set); [`BadArguments`](super::RedisFenceErrorKind::BadArguments)
    /// for no commands, or a command that names the mark key.
    pub async fn call<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &str,
        token: FencingToken,
        commands: &FencedCall,
    ) -> Result<Vec<Value>, RedisFenceError> {
        if commands.count == 0 {
            return Err(RedisFenceError::bad_arguments(
                resource,
                "fenced_call takes at least one command",
            ));
        }
        let keys: Vec<&[u8]> = commands.keys.iter().map(Vec::as_slice).collect();
        match self
            .fenced(
                conn,
                resource,
                "fenced_call",
                &keys,
                token,
                commands.args.clone(),
            )
            .await?
        {
            Value::Array(replies) => Ok(replies),
            other => Err(unexpected(resource, "fenced_call", &other)),
        }
    }

    /// Calls a fenced function: the mark key and `keys`, the token and `args`.
    async fn fenced<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &str,
        name: &'static str,
        keys: &[&[u8]],
        token: FencingToken,
        args: Vec<Vec<u8>>,
    ) -> Result<Value, RedisFenceError> {
        let mark = self.layout().mark_key(resource);
        let mut all_keys = Vec::with_capacity(1 + keys.len());
        all_keys.push(mark.as_bytes());
        all_keys.extend_from_slice(keys);
        let mut all_args = Vec::with_capacity(1 + args.len());
        all_args.push(token.to_string().into_bytes());
        all_args.extend(args);
        let call = Call {
            name,
            read_only: false,
            keys: &all_keys,
            args: &all_args,
        };
        self.invoke(conn, resource, call).await
    }
}

/// Commands for [`RedisFence::call`] (`fenced_call`), each with its keys declared.
///
/// Name a key with [`FencedCommand::key`], never with [`FencedCommand::arg`]: `key`
/// also passes it in `KEYS`, as Redis requires of every key a script touches (Redis
/// Cluster routes the call by them, and ACL key patterns check them).
///
/// # Examples
///
/// ```
/// use palisade_fence::redis::{FencedCall, FencedCommand};
///
/// let call = FencedCall::new()
///     .command(FencedCommand::new("HSET").key("{orders:17}:row").arg("status").arg("paid"))
///     .command(FencedCommand::new("LPUSH").key("{orders:17}:log").arg("paid"));
/// assert_eq!(call.len(), 2);
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct FencedCall {
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    count: usize,
}

impl FencedCall {
    /// No commands yet.
    pub fn new() -> Self {
        FencedCall::default()
    }

    /// Appends `command`.
    pub fn command(mut self, command: FencedCommand) -> Self {
        for k in command.keys {
            if !self.keys.contains(&k) {
                self.keys.push(k);
            }
        }
        self.args.push(command.args.len().to_string().into_bytes());
        self.args.extend(command.args);
        self.count += 1;
        self
    }

    /// The number of commands.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no commands (such a call is refused).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// One command of a [`FencedCall`]: its name, then its arguments in order.
#[derive(Debug, Clone)]
#[must_use]
pub struct FencedCommand {
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl FencedCommand {
    /// A command named `name` (`"HSET"`, `"XADD"`...).
    pub fn new(name: &str) -> Self {
        FencedCommand {
            keys: Vec::new(),
            args: vec![name.as_bytes().to_vec()],
        }
    }

    /// Appends a key (declared to Redis in `KEYS` as well).
    pub fn key<K: ToRedisArgs>(mut self, key: K) -> Self {
        for k in key.to_redis_args() {
            self.keys.push(k.clone());
            self.args.push(k);
        }
        self
    }

    /// Appends an argument that is not a key.
    pub fn arg<A: ToRedisArgs>(mut self, arg: A) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }
}

/// `value` as one argument's bytes (a value that makes several is joined: one key, one
/// value).
fn one<T: ToRedisArgs>(value: T) -> Vec<u8> {
    value.to_redis_args().concat()
}

fn int(resource: &str, name: &str, reply: Value) -> Result<i64, RedisFenceError> {
    match reply {
        Value::Int(n) => Ok(n),
        other => Err(unexpected(resource, name, &other)),
    }
}

pub(crate) fn unexpected(resource: &str, name: &str, reply: &Value) -> RedisFenceError {
    RedisFenceError::library(
        resource,
        format!("{name} answered {reply:?}, which this client does not expect"),
    )
}
