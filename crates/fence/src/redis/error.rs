//! The error of the Redis fence, classified by the library's error codes.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::FencingToken;

/// What went wrong in a call of the fence library. Returned by [`RedisFenceError::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisFenceErrorKind {
    /// The token is below the resource's mark (reply `FENCESTALE`); nothing was written.
    /// [`RedisFenceError::highest`] is the mark.
    Stale,
    /// A token (or a reset's floor) is not a canonical decimal in `0..2^63` (reply
    /// `FENCETOKEN`); nothing was written. Tokens sent from Rust are always canonical:
    /// this comes from other clients' calls, shown here for completeness.
    MalformedToken,
    /// A reset was refused (reply `FENCERESET`): an empty reason, a token not below the
    /// mark, or below the lock's floor. The message says which.
    BadReset,
    /// A reset found no mark to lower (reply `FENCENOMARK`).
    NoMark,
    /// A call of the wrong shape (reply `FENCEARGS`: a key or argument count, a write aimed
    /// at the mark key), or a key prefix with a brace ([`KeyLayout::new`](super::KeyLayout::new)).
    BadArguments,
    /// The mark key holds something that is not a token (reply `FENCEMARK`, or a reply
    /// this crate cannot read): the key was written by something other than the fence.
    /// Nothing was written; every write to the resource fails until an operator mends it.
    CorruptMark,
    /// The library could not be used: the server has a newer version loaded than this
    /// crate's ([`LIBRARY_VERSION`](super::LIBRARY_VERSION)), or answered its version
    /// check with something else.
    Library,
    /// Redis could not answer: the connection is down or timed out, the server is loading,
    /// read-only (a replica after a failover), refuses writes (`NOREPLICAS` under
    /// `min-replicas-to-write`, `MISCONF`, `OOM`), or the cluster is down. Nothing was
    /// decided; trying again may succeed ([`RedisFenceError::is_retryable`]).
    Unavailable,
    /// Any other error from Redis or the client (a `WRONGTYPE` data key, an ACL refusal,
    /// a bad URL); see the [`source`](std::error::Error::source).
    Redis,
}

/// A call of the fence library that did not write, naming the resource and the cause.
///
/// Tell the cases apart with [`kind`](Self::kind) or [`is_stale`](Self::is_stale); a stale
/// write carries the token and the mark ([`token`](Self::token), [`highest`](Self::highest)).
/// Redis's own error, if any, is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RedisFenceError(Box<Repr>);

#[derive(Debug, thiserror::Error)]
enum Repr {
    #[error("stale fencing token {token} for resource {resource:?}: its mark is {highest}; nothing was written")]
    Stale {
        resource: String,
        token: FencingToken,
        highest: FencingToken,
    },
    #[error("fence library refused the call for resource {resource:?}: {detail}")]
    Refused {
        kind: RedisFenceErrorKind,
        resource: String,
        detail: String,
    },
    #[error("key prefix {prefix:?} has a brace; the prefix may not hold `{{` or `}}` (they set a key's Redis Cluster hash tag)")]
    Prefix { prefix: String },
    #[error("fence library for resource {resource:?}: {detail}")]
    Library { resource: String, detail: String },
    #[error("redis is unavailable for the fence of resource {resource:?}; nothing was decided")]
    Unavailable {
        resource: String,
        #[source]
        source: RedisError,
    },
    #[error("redis refused the fence call for resource {resource:?}")]
    Redis {
        resource: String,
        #[source]
        source: RedisError,
    },
}

impl RedisFenceError {
    /// What went wrong.
    pub fn kind(&self) -> RedisFenceErrorKind {
        match &*self.0 {
            Repr::Stale { .. } => RedisFenceErrorKind::Stale,
            Repr::Refused { kind, .. } => *kind,
            Repr::Prefix { .. } => RedisFenceErrorKind::BadArguments,
            Repr::Library { .. } => RedisFenceErrorKind::Library,
            Repr::Unavailable { .. } => RedisFenceErrorKind::Unavailable,
            Repr::Redis { .. } => RedisFenceErrorKind::Redis,
        }
    }

    /// The token was below the resource's mark.
    pub fn is_stale(&self) -> bool {
        self.kind() == RedisFenceErrorKind::Stale
    }

    /// Trying again may succeed: Redis was unavailable
    /// ([`RedisFenceErrorKind::Unavailable`]). A refusal by the fence never is.
    pub fn is_retryable(&self) -> bool {
        self.kind() == RedisFenceErrorKind::Unavailable
    }

    /// The resource the call was for (empty for a bad key prefix).
    pub fn resource(&self) -> &str {
        match &*self.0 {
            Repr::Stale { resource, .. }
            | Repr::Refused { resource, .. }
            | Repr::Library { resource, .. }
            | Repr::Unavailable { resource, .. }
            | Repr::Redis { resource, .. } => resource,
            Repr::Prefix { .. } => "",
        }
    }

    /// The refused token, for a stale write.
    pub fn token(&self) -> Option<FencingToken> {
        match &*self.0 {
            Repr::Stale { token, .. } => Some(*token),
            _ => None,
        }
    }

    /// The resource's mark that refused the token, for a stale write.
    pub fn highest(&self) -> Option<FencingToken> {
        match &*self.0 {
            Repr::Stale { highest, .. } => Some(*highest),
            _ => None,
        }
    }

    pub(crate) fn prefix(prefix: &str) -> Self {
        RedisFenceError(Box::new(Repr::Prefix {
            prefix: prefix.to_owned(),
        }))
    }

    pub(crate) fn library(resource: &str, detail: impl Into<String>) -> Self {
        RedisFenceError(Box::new(Repr::Library {
            resource: resource.to_owned(),
            detail: detail.into(),
        }))
    }

    pub(crate) fn bad_arguments(resource: &str, detail: impl Into<String>) -> Self {
        RedisFenceError(Box::new(Repr::Refused {
            kind: RedisFenceErrorKind::BadArguments,
            resource: resource.to_owned(),
            detail: detail.into(),
        }))
    }

    pub(crate) fn corrupt(resource: &str, detail: impl Into<String>) -> Self {
        RedisFenceError(Box::new(Repr::Refused {
            kind: RedisFenceErrorKind::CorruptMark,
            resource: resource.to_owned(),
            detail: detail.into(),
        }))
    }

    /// Classifies Redis's error for a call about `resource`: the fence library's own
    /// codes first, then what says Redis could not answer.
    pub(crate) fn from_redis(resource: &str, e: RedisError) -> Self {
        let resource = resource.to_owned();
        let code = e.code().unwrap_or_default();
        let detail = || e.detail().unwrap_or_default().to_owned();
        let refused = |kind| {
            RedisFenceError(Box::new(Repr::Refused {
                kind,
                resource: resource.clone(),
                detail: format!("{code} {}", detail()),
            }))
        };
        match code {
            "FENCESTALE" => match parse_stale(e.detail().unwrap_or_default()) {
                Some((highest, token)) => RedisFenceError(Box::new(Repr::Stale {
                    resource,
                    token,
                    highest,
                })),
                None => refused(RedisFenceErrorKind::CorruptMark),
            },
            "FENCETOKEN" => refused(RedisFenceErrorKind::MalformedToken),
            "FENCERESET" => refused(RedisFenceErrorKind::BadReset),
            "FENCENOMARK" => refused(RedisFenceErrorKind::NoMark),
            "FENCEARGS" => refused(RedisFenceErrorKind::BadArguments),
            "FENCEMARK" => refused(RedisFenceErrorKind::CorruptMark),
            _ if unavailable(&e) => RedisFenceError(Box::new(Repr::Unavailable {
                resource,
                source: e,
            })),
            _ => RedisFenceError(Box::new(Repr::Redis {
                resource,
                source: e,
            })),
        }
    }
}

/// Whether Redis could not answer (as opposed to refusing the call): connection errors,
/// timeouts, and the server states that pass (loading, read-only replica, not enough
/// replicas, a failed snapshot, out of memory, cluster down).
fn unavailable(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        )
        | ErrorKind::ClusterConnectionNotFound => true,
        _ => matches!(e.code(), Some("NOREPLICAS" | "MISCONF" | "OOM")),
    }
}

/// The mark and the token of a `FENCESTALE mark=<mark> token=<token> key=<key>` reply's
/// detail (the part after the code).
pub(crate) fn parse_stale(detail: &str) -> Option<(FencingToken, FencingToken)> {
    let mut words = detail.splitn(3, ' ');
    let mark = words.next()?.strip_prefix("mark=")?.parse().ok()?;
    let token = words.next()?.strip_prefix("token=")?.parse().ok()?;
    Some((mark, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_reply_gives_the_mark_and_the_token_exactly_above_2_pow_53() {
        let (mark, token) =
            parse_stale("mark=9007199254740993 token=9007199254740992 key=p:{r x}:mark").unwrap();
        assert_eq!(mark.get(), 9_007_199_254_740_993);
        assert_eq!(token.get(), 9_007_199_254_740_992);
        assert_eq!(parse_stale("mark=1 key=x"), None);
        assert_eq!(parse_stale("mark=-1 token=0 key=x"), None);
        assert_eq!(parse_stale("token=1 mark=2 key=x"), None);
    }

    #[test]
    fn library_codes_map_to_kinds_and_name_the_resource() {
        let e = RedisFenceError::from_redis(
            "orders/1",
            redis::make_extension_error("FENCESTALE".into(), Some("mark=10 token=5 key=k".into())),
        );
        assert_eq!(e.kind(), RedisFenceErrorKind::Stale);
        assert_eq!(
            (e.token().unwrap().get(), e.highest().unwrap().get()),
            (5, 10)
        );
        assert!(e.to_string().contains("\"orders/1\""), "{e}");
        for (code, kind) in [
            ("FENCETOKEN", RedisFenceErrorKind::MalformedToken),
            ("FENCERESET", RedisFenceErrorKind::BadReset),
            ("FENCENOMARK", RedisFenceErrorKind::NoMark),
            ("FENCEARGS", RedisFenceErrorKind::BadArguments),
            ("FENCEMARK", RedisFenceErrorKind::CorruptMark),
            ("NOREPLICAS", RedisFenceErrorKind::Unavailable),
            ("WRONGTYPE", RedisFenceErrorKind::Redis),
        ] {
            let e = RedisFenceError::from_redis(
                "r",
                redis::make_extension_error(code.into(), Some("why key=k".into())),
            );
            assert_eq!(e.kind(), kind, "{code}");
            assert!(!e.is_stale());
            assert_eq!(e.is_retryable(), kind == RedisFenceErrorKind::Unavailable);
        }
    }
}
