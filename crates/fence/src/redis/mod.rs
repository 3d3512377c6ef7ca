//! The fence on Redis: a Redis Function library that checks a token and writes in one
//! atomic call, usable from any language with plain `FCALL`.
//!
//! A Redis script runs alone: no other command runs between its reads and its writes. The
//! library `palisade_fence` ([`LIBRARY`], loaded with `FUNCTION LOAD REPLACE` by
//! [`load_library`]) reads the resource's mark, refuses a token below it, and otherwise
//! writes and raises the mark, all in that one run. So the check and the write are one
//! atomic step (invariant 3 of the architecture), for every client that writes through
//! the functions. A write that reaches Redis by another path (a plain `SET`) is not
//! checked: only the audit of unprotected writes notices it.
//!
//! # Functions
//!
//! | function | `KEYS` | `ARGV` | reply |
//! |---|---|---|---|
//! | `fence_raise` | mark | token | `1` the mark rose, `0` it equals the token |
//! | `fenced_set` | mark, key | token, value, SET options... | SET's reply |
//! | `fenced_hset` | mark, key | token, field, value, ... | fields added |
//! | `fenced_del` | mark, key, ... | token | keys removed |
//! | `fenced_incrby` | mark, key | token, increment | the new value |
//! | `fenced_call` | mark, every key the commands touch | token, then per command its argument count and arguments (`2 GET k 3 SET k v`) | the replies |
//! | `fence_mark` (read-only) | mark | | nil, or `[token, updated_ms]` |
//! | `fence_reset` | mark, reset log | to, reason, reset_by, lock, floor | the old mark |
//! | `fence_version` (read-only) | | | [`LIBRARY_VERSION`] |
//!
//! The keys are built by [`KeyLayout`]: `palisade:fence:{<resource>}:mark` by default.
//! Tokens travel as decimal strings and are compared as strings, exactly, at any size
//! (a Lua number would round tokens above 2^53).
//!
//! # Replies
//!
//! An equal token is admitted; marks only rise. Every refusal is an error reply whose
//! first word says why, and writes nothing:
//!
//! | reply | meaning | [`RedisFenceErrorKind`] |
//! |---|---|---|
//! | `FENCESTALE mark=<mark> token=<token> key=<mark key>` | the token is below the mark | `Stale` |
//! | `FENCETOKEN ...` | a token that is not a canonical decimal in `0..2^63` (sign, leading zero, too large) | `MalformedToken` |
//! | `FENCEARGS ...` | wrong key or argument count; a write aimed at the mark key | `BadArguments` |
//! | `FENCERESET ...` | a reset without a reason, not below the mark, or below the lock's floor | `BadReset` |
//! | `FENCENOMARK ... no mark ...` | a reset of a resource with no mark | `NoMark` |
//! | `FENCEMARK ...` | the mark key holds something that is not a token | `CorruptMark` |
//!
//! # Servers without Redis Functions
//!
//! Redis before 7.0 has no `FCALL`. The same Lua source without its first line
//! ([`eval_source`]) runs under `EVALSHA`, with the function's name as `ARGV[1]`:
//! [`RedisFence::load`] picks it when the server lacks `FCALL` ([`Dispatch::Eval`]).
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_fence::redis::{RedisFence, RedisFenceErrorKind};
//! use palisade_fence::FencingToken;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! let fence = RedisFence::load(&mut conn).await?;
//! let token: FencingToken = "281474976710700".parse()?;
//! match fence.set(&mut conn, "orders:17", token, "{orders:17}:status", "paid").await {
//!     Ok(()) => {}
//!     Err(e) if e.kind() == RedisFenceErrorKind::Stale => {
//!         // A newer holder has written; e.highest() is its token. Nothing was written.
//!     }
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! docs/resources.md ("Redis") has the durability and failover story and examples from
//! `redis-cli` and Python.

mod admin;
mod error;
mod keys;
mod library;
mod write;

pub use admin::{read_mark, read_resets, reset_mark, reset_mark_guarded};
pub use error::{RedisFenceError, RedisFenceErrorKind};
pub use keys::KeyLayout;
pub use library::{load_library, Dispatch, LibraryLoad, RedisFence};
pub use write::{FencedCall, FencedCommand};

/// The library's source: Lua, `#!lua name=palisade_fence`, for `FUNCTION LOAD REPLACE`.
/// The file is `crates/fence/redis/palisade_fence.lua`.
pub const LIBRARY: &str = include_str!("../../redis/palisade_fence.lua");

/// The library's name in Redis (`FUNCTION LIST LIBRARYNAME palisade_fence`).
pub const LIBRARY_NAME: &str = "palisade_fence";

/// The version of [`LIBRARY`], as its function `fence_version` reports it. Raised with
/// every change of the Lua source.
pub const LIBRARY_VERSION: i64 = 3;

/// The library as an `EVAL` script: [`LIBRARY`] without its first (`#!lua`) line. Run
/// with the function's name as `ARGV[1]` and the function's arguments after it
/// (`EVAL <script> 1 <mark key> fence_raise <token>`).
pub fn eval_source() -> &'static str {
    match LIBRARY.split_once('\n') {
        Some((_, rest)) => rest,
        None => LIBRARY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_names_itself_and_its_version_as_the_rust_side_does() {
        let first = LIBRARY.lines().next().unwrap();
        assert_eq!(first, format!("#!lua name={LIBRARY_NAME}"));
        assert!(LIBRARY.contains(&format!("\nlocal VERSION = {LIBRARY_VERSION}\n")));
        assert!(!eval_source().starts_with("#!"));
        assert_eq!(eval_source().len() + first.len() + 1, LIBRARY.len());
    }
}
