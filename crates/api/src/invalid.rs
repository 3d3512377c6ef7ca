//! [`InvalidInput`]: why input was refused, before anything was written.

use std::time::Duration;

/// Why input was refused. Nothing was written to etcd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The lock key is empty.
    #[error("lock key is empty")]
    EmptyKey,
    /// The lock key has a `..` path segment.
    #[error("lock key has a `..` segment")]
    DotDotSegment,
    /// The lock key has a control character (Unicode `Cc`, NUL included).
    #[error("lock key has a control character (NUL included)")]
    ControlCharacter,
    /// The lock key has a bidirectional formatting character, which makes it display as
    /// another key (see [`validate_key`](crate::validate_key)).
    #[error("lock key has the bidirectional formatting character U+{:04X} at byte {at} (such characters make a key display as another)", u32::from(*ch))]
    BidiControl {
        /// The character.
        ch: char,
        /// Its byte offset in the key.
        at: usize,
    },
    /// The lock key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("lock key is longer than {} bytes", crate::MAX_KEY_LEN)]
    KeyTooLong,
    /// The lock key does not start with its class's key prefix.
    #[error("lock key is outside the class's key prefix {prefix:?}")]
    KeyOutsideClass {
        /// The class's key prefix.
        prefix: String,
    },
    /// A namespace or class name is not `[a-z0-9][a-z0-9_-]{0,62}`.
    #[error("name {0:?} is not [a-z0-9][a-z0-9_-]{{0,62}}")]
    BadName(String),
    /// A text field that breaks the rule of [`validate_text`](crate::validate_text).
    #[error("{field} {fault}")]
    BadText {
        /// The field, as the request names it (`reason`, `tenant_id`...).
        field: &'static str,
        /// What is wrong with it.
        fault: crate::TextFault,
    },
    /// A query-string parameter that does not decode to UTF-8 (see
    /// [`validate_query_utf8`](crate::validate_query_utf8)).
    #[error("query parameter {param:?} is not UTF-8 once percent-decoded")]
    QueryNotUtf8 {
        /// The parameter's name, as far as it decodes.
        param: String,
    },
    /// A SPIFFE ID that does not start with `spiffe://` or is otherwise malformed (see
    /// [`SpiffeId::new`](crate::SpiffeId::new)).
    #[error(
        "malformed SPIFFE ID {0:?}: want spiffe://TRUST-DOMAIN/PATH, the trust domain of \
         a-z 0-9 . - _ and each path segment of A-Z a-z 0-9 . - _, not . or .., at most 2048 bytes"
    )]
    BadSpiffeId(String),
    /// The session's TTL is outside the class's bounds.
    #[error("session TTL {ttl:?} is outside the class's TTL bounds, from {min:?} to {max:?}")]
    TtlOutOfBounds {
        /// The session's TTL.
        ttl: Duration,
        /// The class's `ttl_min`.
        min: Duration,
        /// The class's `ttl_max`.
        max: Duration,
    },
    /// A session TTL outside the service's range: a whole number of seconds from 1 to
    /// the maximum ([`limits`](crate::limits)).
    #[error(
        "session TTL {} is not a whole number of seconds from 1 to {} s",
        crate::limits::shown(*ttl),
        max.as_secs()
    )]
    SessionTtlOutOfRange {
        /// The TTL asked for.
        ttl: Duration,
        /// The service's maximum.
        max: Duration,
    },
    /// A class field in milliseconds above its bound ([`limits`](crate::limits)).
    #[error(
        "{field} {} is above {} (ms; from 0 to {} s)",
        value.as_millis(),
        max.as_millis(),
        max.as_secs()
    )]
    OutOfRange {
        /// The field, as the request names it (`ttl_max_ms`, `lock_delay_ms`...).
        field: &'static str,
        /// The value given.
        value: Duration,
        /// The largest accepted.
        max: Duration,
    },
    /// A TTL that etcd cannot grant: not a whole number of seconds, below one second,
    /// or above etcd's maximum lease TTL (9,000,000,000 s).
    #[error("TTL {0:?} is not a whole number of seconds from 1 to 9000000000")]
    BadTtl(Duration),
    /// A class whose `ttl_min` is above its `ttl_max`.
    #[error("class ttl_min {min:?} is above ttl_max {max:?}")]
    TtlBoundsInverted {
        /// `ttl_min`.
        min: Duration,
        /// `ttl_max`.
        max: Duration,
    },
    /// A class whose key prefix overlaps another class's prefix in the same namespace.
    #[error(
        "class key prefix overlaps the prefix of class {other:?}: no class's prefix may start \
         with another's in one namespace (an empty prefix covers every key); give each class \
         its own prefix, such as \"invoice-\" and \"nightly-\""
    )]
    PrefixOverlap {
        /// The other class.
        other: String,
    },
    /// The namespace is not configured.
    #[error("namespace {0:?} does not exist")]
    UnknownNamespace(String),
    /// The class is not configured in the namespace.
    #[error("class {0:?} does not exist")]
    UnknownClass(String),
    /// A shared acquire on a class whose mode is exclusive.
    #[error("shared mode is not allowed by an exclusive class")]
    ModeNotAllowed,
    /// This session already holds, or is waiting for, this lock.
    #[error("this session already holds or waits for this lock")]
    AlreadyAcquiring,
    /// An acquire `attempt` id outside 1 to 2^53 − 1 ([`AttemptId`](crate::AttemptId)).
    #[error("attempt {0} is not from 1 to 9007199254740991 (2^53 - 1)")]
    BadAttempt(u64),
    /// Holder meta over [`MAX_HOLDER_META_LEN`](crate::MAX_HOLDER_META_LEN) bytes of
    /// compact JSON.
    #[error(
        "holder_meta is {len} bytes of JSON, more than {}",
        crate::MAX_HOLDER_META_LEN
    )]
    HolderMetaTooLarge {
        /// Its length as compact JSON, in bytes.
        len: usize,
    },
    /// Holder meta that is not a JSON object.
    #[error("holder_meta must be a JSON object")]
    HolderMetaNotObject,
    /// An epoch reservation window above `MAX_EPOCH_WINDOW` (2^20) revisions
    /// (`LockerOptions::with_epoch_window`).
    #[error("epoch reservation window {window} is above {max} revisions")]
    EpochWindowTooLarge {
        /// The window asked for, in etcd revisions.
        window: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A session id that is neither 16 lower-case hex digits (a session on the home
    /// tier) nor `<tier>.<16 hex digits>` (see [`TieredSessionId`](crate::TieredSessionId)).
    #[error("a session id is 16 lower-case hex digits, or <tier>.<16 hex digits>")]
    BadSessionId,
    /// A well-formed session id that no live session has: its lease expired or was
    /// revoked, or no lease can have it (etcd's lease ids are positive, so
    /// `0000000000000000` is none). The service answers it 404 `not-found`.
    #[error("no live session {0} (expired, closed or never opened)")]
    UnknownSession(String),
    /// A tier name that is not one of the service's configured etcd cluster tiers.
    #[error("unknown cluster tier {0:?}: not one of this service's tiers")]
    UnknownTier(String),
    /// A namespace's `cluster_tier` changed by a plain update; moving a namespace is a
    /// rehome (`palisade namespace rehome NS --to TIER`).
    #[error("namespace {ns:?} lives on tier {tier:?}: move it with a rehome, not an update")]
    TierChangeNeedsRehome {
        /// The namespace.
        ns: String,
        /// The tier it lives on.
        tier: String,
    },
}
