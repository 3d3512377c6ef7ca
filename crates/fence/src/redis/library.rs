//! Loading the library, and calling its functions with FCALL or, on a server without
//! Redis Functions, with EVALSHA.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use super::{eval_source, KeyLayout, RedisFenceError, LIBRARY, LIBRARY_NAME, LIBRARY_VERSION};

/// How a [`RedisFence`] calls the library's functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dispatch {
    /// `FCALL` / `FCALL_RO` of the loaded `palisade_fence` library (Redis 7 or later).
    Functions,
    /// `EVALSHA` of [`eval_source`](super::eval_source) (`EVAL` once when the server lacks
    /// the script), with the function's name as the first argument: for servers without
    /// Redis Functions (Redis 5 and 6). The same Lua source, so the same checks.
    Eval,
}

/// What [`load_library`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LibraryLoad {
    /// The server had this version already; nothing was sent.
    Current,
    /// The server had no `palisade_fence` library; it has it now.
    Loaded,
    /// The server had an older version (the number given); it was replaced.
    Replaced {
        /// The version that was loaded before.
        from: i64,
    },
}

/// The fence library on one Redis deployment: how its functions are called ([`Dispatch`])
/// and where the marks are kept ([`KeyLayout`]). Cheap to clone.
///
/// Make one with [`load`](Self::load) (loads the library if needed, or picks the
/// EVALSHA fallback on a server without functions), or [`eval`](Self::eval) to use the
/// fallback whatever the server. Then call the fenced writes
/// ([`set`](Self::set), [`hset`](Self::hset), [`del`](Self::del),
/// [`incrby`](Self::incrby), [`call`](Self::call), [`raise`](Self::raise)) and the admin
/// functions ([`read_mark`](super::read_mark), [`read_resets`](super::read_resets),
/// [`reset_mark_guarded`](super::reset_mark_guarded)) on any async connection
/// (`redis::aio::ConnectionManager`, `MultiplexedConnection`...).
///
/// With [`Dispatch::Functions`], a call that finds the library missing (a server
/// restarted without persistence, or `FUNCTION FLUSH`) loads it again and is sent once
/// more.
#[derive(Debug, Clone)]
pub struct RedisFence {
    layout: KeyLayout,
    dispatch: Dispatch,
    script: Arc<Script>,
}

impl RedisFence {
    /// The fence on `conn`'s server, under the default [`KeyLayout`]: the `palisade_fence`
    /// library loaded ([`load_library`]) when the server has Redis Functions (it has the
    /// command `FCALL`), else the EVALSHA fallback.
    ///
    /// # Errors
    ///
    /// As [`load_library`]; [`Unavailable`](super::RedisFenceErrorKind::Unavailable) when
    /// Redis does not answer.
    pub async fn load<C: ConnectionLike + Send>(conn: &mut C) -> Result<Self, RedisFenceError> {
        let info: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("FCALL")
            .query_async(conn)
            .await
            .map_err(|e| RedisFenceError::from_redis("", e))?;
        let has_functions = match info {
            Value::Array(entries) => entries.first().is_some_and(|e| *e != Value::Nil),
            _ => false,
        };
        if !has_functions {
            return Ok(RedisFence::eval());
        }
        load_library(conn).await?;
        Ok(RedisFence::with_dispatch(Dispatch::Functions))
    }

    /// The fence through the EVALSHA fallback, whatever the server (the script is sent
    /// with `EVAL` when the server lacks it, so nothing needs loading).
    pub fn eval() -> Self {
        RedisFence::with_dispatch(Dispatch::Eval)
    }

    fn with_dispatch(dispatch: Dispatch) -> Self {
        RedisFence {
            layout: KeyLayout::default(),
            dispatch,
            script: Arc::new(Script::new(eval_source())),
        }
    }

    /// Keeps the marks under `layout` instead of the default.
    #[must_use]
    pub fn with_layout(mut self, layout: KeyLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Where the marks are kept.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// How the functions are called.
    pub fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// Calls a function for `resource`; the reply, or the error classified for
    /// `resource`.
    pub(crate) async fn invoke<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        resource: &str,
        call: Call<'_>,
    ) -> Result<Value, RedisFenceError> {
        let outcome = match self.dispatch {
            Dispatch::Functions => {
                let mut cmd = redis::cmd(if call.read_only { "FCALL_RO" } else { "FCALL" });
                cmd.arg(call.name).arg(call.keys.len());
                for k in call.keys {
                    cmd.arg(k);
                }
                cmd.arg(call.args);
                match cmd.query_async(conn).await {
                    Err(e) if function_missing(&e) => {
                        load_library(conn).await?;
                        cmd.query_async(conn).await
                    }
                    other => other,
                }
            }
            Dispatch::Eval => {
                let mut invocation = self.script.prepare_invoke();
                for k in call.keys {
                    invocation.key(k);
                }
                invocation.arg(call.name).arg(call.args);
                invocation.invoke_async(conn).await
            }
        };
        outcome.map_err(|e| RedisFenceError::from_redis(resource, e))
    }
}

/// One call of a library function.
pub(crate) struct Call<'a> {
    pub(crate) name: &'static str,
    pub(crate) read_only: bool,
    pub(crate) keys: &'a [&'a [u8]],
    pub(crate) args: &'a [Vec<u8>],
}

/// Makes sure `conn`'s server runs this crate's version of the `palisade_fence` library:
/// asks the loaded library its version (`FCALL_RO fence_version 0`) and, when it is
/// missing or older than [`LIBRARY_VERSION`], sends `FUNCTION LOAD REPLACE`
/// [`LIBRARY`]. A newer version is left alone and refused: an older client must not
/// replace the library a newer one relies on. (Two processes of different versions that
/// check at the same moment may both load; the last one wins. Upgrade clients in order.)
///
/// Loading needs the ACL right to run `FUNCTION LOAD`; a client that lacks it works as
/// long as an administrator loaded the current version (`redis-cli FUNCTION LOAD REPLACE
/// "$(cat palisade_fence.lua)"`). The library is replicated and persisted with the data.
///
/// # Errors
///
/// [`Library`](super::RedisFenceErrorKind::Library) for a newer version or a version
/// reply that is not a number; [`Unavailable`](super::RedisFenceErrorKind::Unavailable)
/// or [`Redis`](super::RedisFenceErrorKind::Redis) from the commands (a server without
/// Redis Functions fails here with `ERR unknown command`).
pub async fn load_library<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<LibraryLoad, RedisFenceError> {
    let version: Result<Value, RedisError> = redis::cmd("FCALL_RO")
        .arg("fence_version")
        .arg(0)
        .query_async(conn)
        .await;
    let outcome = match version {
        Ok(Value::Int(v)) if v == LIBRARY_VERSION => {
            return match loaded_code(conn).await? {
                // (`redis-cli FUNCTION LOAD "$(cat palisade_fence.lua)"` drops the file's
                // last newline: trailing whitespace does not count.)
                Some(code) if code.trim_ascii_end() == LIBRARY.trim_end().as_bytes() => {
                    Ok(LibraryLoad::Current)
                }
                Some(_) => Err(RedisFenceError::library(
                    "",
                    format!(
                        "the server's palisade_fence library says it is version {v}, this \
                         client's, but its code is not this client's: something else was \
                         loaded under the fence's name; load the fence's own with FUNCTION \
                         LOAD REPLACE"
                    ),
                )),
                // Listing needs `function|list`; without it the version is all there is.
                None => Ok(LibraryLoad::Current),
            };
        }
        Ok(Value::Int(v)) if v > LIBRARY_VERSION => {
            return Err(RedisFenceError::library(
                "",
                format!(
                    "the server runs version {v} of the palisade_fence library, newer than this \
                     client's {LIBRARY_VERSION}; upgrade the client (it will not replace a newer library)"
                ),
            ))
        }
        Ok(Value::Int(v)) => LibraryLoad::Replaced { from: v },
        Ok(other) => {
            return Err(RedisFenceError::library(
                "",
                format!("fence_version answered {other:?}, not a version number"),
            ))
        }
        Err(e) if function_missing(&e) => LibraryLoad::Loaded,
        Err(e) => return Err(RedisFenceError::from_redis("", e)),
    };
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg("REPLACE").arg(LIBRARY);
    load.query_async::<Value>(conn)
        .await
        .map_err(|e| RedisFenceError::from_redis("", e))?;
    Ok(outcome)
}

/// The code of the loaded `palisade_fence` library (`FUNCTION LIST LIBRARYNAME
/// palisade_fence WITHCODE`); `None` when the connection may not list functions (ACL).
async fn loaded_code<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<Option<Vec<u8>>, RedisFenceError> {
    let listed: Result<Value, RedisError> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(LIBRARY_NAME)
        .arg("WITHCODE")
        .query_async(conn)
        .await;
    let listed = match listed {
        Ok(v) => v,
        Err(e) if e.code() == Some("NOPERM") => return Ok(None),
        Err(e) => return Err(RedisFenceError::from_redis("", e)),
    };
    // One entry per library whose name matches the pattern (the name has no glob
    // character); each a map (RESP3) or a flat list of names and values (RESP2).
    let Value::Array(libraries) = listed else {
        return Ok(Some(Vec::new()));
    };
    for library in libraries {
        let pairs: Vec<(Value, Value)> = match library {
            Value::Map(pairs) => pairs,
            Value::Array(flat) => {
                let mut it = flat.into_iter();
                let mut pairs = Vec::new();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                pairs
            }
            _ => continue,
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| text_of(k) == Some(name))
                .map(|(_, v)| v.clone())
        };
        if field("library_name").as_ref().and_then(text_of) == Some(LIBRARY_NAME) {
            return Ok(Some(match field("library_code") {
                Some(Value::BulkString(code)) => code,
                _ => Vec::new(),
            }));
        }
    }
    Ok(Some(Vec::new()))
}

fn text_of(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Whether FCALL found no such function: `ERR Function not found` (Redis gives this
/// case no code of its own, so the message is the only sign).
fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}
