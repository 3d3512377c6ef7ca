//! Problem kinds: the `type` of every `application/problem+json` (RFC 9457) answer the
//! service gives, with its slug and status code. The server renders them; the client
//! reads them back with [`ProblemKind::from_type_uri`].

use http::StatusCode;

/// What every problem `type` URI starts with; the slug follows.
pub const TYPE_PREFIX: &str = "urn:palisade:problem:";

/// The kinds of problem the API reports. Each has a stable `type` URI,
/// `urn:palisade:problem:<slug>`, and one status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the request was refused before anything was written (bad JSON, unknown
    /// fields, bad names or keys, TTLs out of range...). 413 for an oversized body.
    InvalidInput,
    /// 401: no caller identity, or a dev identity header without dev mode.
    Unauthenticated,
    /// 403: the caller may not do this (authorization config, or another identity's
    /// session); from the audit dashboard, a request for a host it does not answer to.
    Forbidden,
    /// 404: unknown namespace, class, route or session.
    NotFound,
    /// 409: the hold is no longer held (released, expired, force-released).
    NotHeld,
    /// 409: the wait deadline passed while others held the lock.
    DeadlineExceeded,
    /// 409: the session already holds the lock, granted to another acquire (another
    /// `attempt`); the detail names that hold's `grant_rev`. Nothing was written. An
    /// acquire that names that hold in `replaces` (its holder let it go, and its
    /// release's outcome is unknown) ends it and takes its place.
    AlreadyHeld,
    /// 409: another acquire of the session (another `attempt`) is waiting for the lock;
    /// the detail names its attempt. Nothing was written. A retry of that acquire (the
    /// same `attempt`) takes over its place in the queue.
    AcquireInFlight,
    /// 410: the session's lease is gone.
    SessionLost,
    /// 409: the force release request was already approved.
    AlreadyApproved,
    /// 409: the hold was force-released (the detail names the request). A release or
    /// keepalive of its session tells the holder so, rather than just "not held".
    HoldForced,
    /// 409: an approval found the holds its request named gone or replaced (released,
    /// expired, or granted anew since the request): it released nothing.
    ForceTargetGone,
    /// 429: a quota of the namespace (`held_lease_quota` or `op_rate_quota`, named in
    /// the detail) is reached; `op_rate_quota` answers carry `Retry-After` (seconds).
    QuotaExceeded,
    /// 503: grants are refused until an operator advances the epoch.
    EpochMismatch,
    /// 409: the epoch is at its maximum and cannot be advanced.
    EpochExhausted,
    /// 503: etcd could not commit in time.
    QuorumLost,
    /// 502: etcd or the force release database answered with an unexpected error.
    Upstream,
    /// 500: a record in etcd could not be decoded, or another fault of the service.
    Internal,
    /// 409: the namespace lives on another etcd cluster tier than the session's; the
    /// detail names the tier to open a session on.
    WrongTier,
    /// 503: the namespace is being rehomed to another tier and grants nothing until the
    /// move ends (or is rolled back); answers carry `Retry-After` (seconds).
    NamespaceMoving,
    /// 503: this replica is stopping (SIGTERM): an acquire still waiting is answered so,
    /// its waiter key withdrawn, instead of holding the shutdown for up to its
    /// `wait_ms`; answers carry `Retry-After` (seconds). Another replica can serve it.
    ShuttingDown,
    /// 503: the durable epoch record outside etcd (the epoch store, e.g. its Postgres
    /// table) could not be read or written, so no token can be handed out: an outage of
    /// the operator's store, not a fault of the request or the service; answers carry
    /// `Retry-After` (seconds).
    EpochStoreUnavailable,
}

impl ProblemKind {
    /// Every kind, in declaration order.
    pub const ALL: [ProblemKind; 22] = [
        ProblemKind::InvalidInput,
        ProblemKind::Unauthenticated,
        ProblemKind::Forbidden,
        ProblemKind::NotFound,
        ProblemKind::NotHeld,
        ProblemKind::DeadlineExceeded,
        ProblemKind::AlreadyHeld,
        ProblemKind::AcquireInFlight,
        ProblemKind::SessionLost,
        ProblemKind::AlreadyApproved,
        ProblemKind::HoldForced,
        ProblemKind::ForceTargetGone,
        ProblemKind::QuotaExceeded,
        ProblemKind::EpochMismatch,
        ProblemKind::EpochExhausted,
        ProblemKind::QuorumLost,
        ProblemKind::Upstream,
        ProblemKind::Internal,
        ProblemKind::WrongTier,
        ProblemKind::NamespaceMoving,
        ProblemKind::ShuttingDown,
        ProblemKind::EpochStoreUnavailable,
    ];

    /// The slug used in the `type` URI.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::InvalidInput => "invalid-input",
            ProblemKind::Unauthenticated => "unauthenticated",
            ProblemKind::Forbidden => "forbidden",
            ProblemKind::NotFound => "not-found",
            ProblemKind::NotHeld => "not-held",
            ProblemKind::DeadlineExceeded => "deadline-exceeded",
            ProblemKind::AlreadyHeld => "already-held",
            ProblemKind::AcquireInFlight => "acquire-in-flight",
            ProblemKind::SessionLost => "session-lost",
            ProblemKind::AlreadyApproved => "already-approved",
            ProblemKind::HoldForced => "hold-forced",
            ProblemKind::ForceTargetGone => "force-target-gone",
            ProblemKind::QuotaExceeded => "quota-exceeded",
            ProblemKind::EpochMismatch => "epoch-mismatch",
            ProblemKind::EpochExhausted => "epoch-exhausted",
            ProblemKind::QuorumLost => "quorum-lost",
            ProblemKind::Upstream => "upstream",
            ProblemKind::Internal => "internal",
            ProblemKind::WrongTier => "wrong-tier",
            ProblemKind::NamespaceMoving => "namespace-moving",
            ProblemKind::ShuttingDown => "shutting-down",
            ProblemKind::EpochStoreUnavailable => "epoch-store-unavailable",
        }
    }

    /// The `type` URI: `urn:palisade:problem:<slug>`.
    pub fn type_uri(self) -> String {
        format!("{TYPE_PREFIX}{}", self.slug())
    }

    /// The kind of a slug; `None` for a slug this version does not know.
    pub fn from_slug(slug: &str) -> Option<ProblemKind> {
        ProblemKind::ALL.into_iter().find(|k| k.slug() == slug)
    }

    /// The kind of a `type` URI (or of a bare slug); `None` for one this version does not
    /// know.
    pub fn from_type_uri(uri: &str) -> Option<ProblemKind> {
        ProblemKind::from_slug(uri.strip_prefix(TYPE_PREFIX).unwrap_or(uri))
    }

    /// The default status code.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::InvalidInput => StatusCode::BAD_REQUEST,
            ProblemKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProblemKind::Forbidden => StatusCode::FORBIDDEN,
            ProblemKind::NotFound => StatusCode::NOT_FOUND,
            ProblemKind::NotHeld
            | ProblemKind::DeadlineExceeded
            | ProblemKind::AlreadyHeld
            | ProblemKind::AcquireInFlight
            | ProblemKind::EpochExhausted
            | ProblemKind::AlreadyApproved
            | ProblemKind::HoldForced
            | ProblemKind::ForceTargetGone
            | ProblemKind::WrongTier => StatusCode::CONFLICT,
            ProblemKind::SessionLost => StatusCode::GONE,
            ProblemKind::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ProblemKind::EpochMismatch
            | ProblemKind::QuorumLost
            | ProblemKind::NamespaceMoving
            | ProblemKind::ShuttingDown
            | ProblemKind::EpochStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,

            ProblemKind::Upstream => StatusCode::BAD_GATEWAY,
            ProblemKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_type_uri_and_slugs_are_distinct() {
        for k in ProblemKind::ALL {
            assert_eq!(ProblemKind::from_type_uri(&k.type_uri()), Some(k));
            assert_eq!(ProblemKind::from_slug(k.slug()), Some(k));
        }
        let mut slugs: Vec<_> = ProblemKind::ALL.iter().map(|k| k.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), ProblemKind::ALL.len());
        assert_eq!(
            ProblemKind::from_type_uri("urn:palisade:problem:brand-new"),
            None
        );
        assert_eq!(ProblemKind::NotHeld.status(), StatusCode::CONFLICT);
        assert_eq!(
            ProblemKind::QuorumLost.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ProblemKind::EpochStoreUnavailable.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ProblemKind::EpochStoreUnavailable.type_uri(),
            "urn:palisade:problem:epoch-store-unavailable"
        );
    }
}
