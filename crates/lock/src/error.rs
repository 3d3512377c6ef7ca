//! The crate's one error type: an opaque [`Error`] with a public, `#[non_exhaustive]`
//! [`ErrorKind`] and query methods. Nothing is classified by message text.

use std::fmt;

pub(crate) use palisade_api::InvalidInput;
use palisade_api::Mode;
use palisade_fence::{Epoch, Revision};

/// Shorthand for `Result<T, palisade_lock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, for callers that branch on it. Prefer the `is_*` query methods on
/// [`Error`]; match on this only when the details matter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's input was refused before anything was written to etcd.
    InvalidInput(InvalidInput),
    /// A release (or other operation on a hold) found the hold gone: it expired, was
    /// force-released, or was already released.
    NotHeld,
    /// The etcd cluster does not match the current epoch record (another cluster id, or a
    /// revision below the highest grant revision recorded: a restore). Grants stay refused
    /// until an operator advances the epoch.
    EpochMismatch(EpochMismatch),
    /// The epoch cannot be advanced: it is already [`Epoch::MAX`].
    EpochExhausted,
    /// etcd could not commit before the caller's deadline (no leader, timeouts,
    /// unreachable members) and the class's quorum policy is `closed`. Only when etcd
    /// was seen failing: an error, or no answer within a whole request timeout
    /// ([`LockerOptions::with_request_timeout`](crate::LockerOptions::with_request_timeout)).
    QuorumLost,
    /// The caller's deadline passed while the lock was held by others, or cut an etcd
    /// call short before etcd was seen failing (see [`ErrorKind::QuorumLost`]).
    DeadlineExceeded,
    /// The session's lease is gone (expired, revoked, or the session was closed).
    SessionLost,
    /// The session already holds the lock under another acquire (another attempt id),
    /// and this acquire did not name that hold in `replaces`. Nothing of this acquire
    /// stays in etcd.
    AlreadyHeld {
        /// The hold's mode.
        mode: Mode,
        /// The hold's grant revision.
        grant_rev: Revision,
        /// The attempt that was granted it (0 for a hold written before attempts were
        /// named by clients).
        attempt: u64,
    },
    /// Another acquire of the session (another attempt id) waits for the lock, or a
    /// retry of this acquire (the same attempt id) took over its place in the queue.
    /// Nothing of this acquire stays in etcd (a retry that took over keeps its own).
    AcquireInFlight {
        /// The attempt that waits.
        attempt: u64,
        /// Whether this acquire was taken over by a retry of its own attempt.
        taken_over: bool,
    },
    /// etcd answered with an error that is none of the above.
    Etcd,
    /// The durable epoch record outside etcd could not be read or written.
    EpochStore,
    /// A record in etcd under the root prefix could not be decoded.
    CorruptRecord,
    /// The namespace's `held_lease_quota` of sessions, holds and waits is reached
    /// ([`Locker::acquire_in_quota`](crate::Locker::acquire_in_quota), [`Locker::take_session_quota_slot`](crate::Locker::take_session_quota_slot)).
    QuotaExceeded {
        /// The namespace.
        ns: String,
        /// Its `held_lease_quota`.
        quota: u32,
    },
    /// The identity already has this many open sessions, the service's per-identity
    /// limit ([`Locker::open_detached_session_limited`](crate::Locker::open_detached_session_limited)).
    SessionLimit {
        /// The limit.
        limit: u32,
    },
    /// The namespace is fenced on this etcd cluster (`tier/fence/<ns>` exists): it is
    /// being rehomed, or it lives on another tier. Nothing was written.
    NamespaceFenced {
        /// The namespace.
        ns: String,
    },
    /// The namespace lives on another tier than the one asked
    /// ([`Tiers`](crate::Tiers)).
    WrongTier {
        /// The namespace.
        ns: String,
        /// The tier it lives on.
        tier: String,
    },
    /// A rehome of the namespace is already in progress to another tier (or by
    /// another caller at the same time); retry it with the same target, or wait.
    RehomeInProgress {
        /// The namespace.
        ns: String,
        /// The tier that rehome moves it to.
        to: String,
    },
    /// A rehome waited out its drain deadline while the namespace still had holds or
    /// waiters on its old tier; it was rolled back (the namespace stays on the old
    /// tier and grants again).
    DrainTimeout {
        /// The namespace.
        ns: String,
        /// Holds left on the old tier when it gave up.
        holds: usize,
        /// Waiters left on the old tier when it gave up.
        waiters: usize,
    },
    /// Two configured tiers answer with the same etcd cluster id (one cluster named
    /// twice).
    SameClusterTiers {
        /// One tier.
        a: String,
        /// The other.
        b: String,
        /// Their cluster id.
        cluster_id: u64,
    },
}

/// Which epoch check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EpochMismatch {
    /// etcd answered with another cluster id than the epoch record names (restore into a
    /// new cluster, or the endpoints point at another cluster).
    #[error("etcd cluster id {actual:#x} differs from the epoch record's {recorded:#x}")]
    ClusterId {
        /// Recorded.
        recorded: u64,
        /// Seen in a response header.
        actual: u64,
    },
    /// etcd's revision is below the highest grant revision recorded for this epoch, or
    /// below a revision this locker already saw (etcd restored from an older snapshot,
    /// even with the same cluster id).
    #[error("etcd revision {actual} is below revision {recorded} already recorded or seen in this epoch")]
    RevisionBehind {
        /// Highest revision recorded or seen.
        recorded: Revision,
        /// Seen in a response header.
        actual: Revision,
    },
    /// The epoch record in etcd and the durable record disagree (or one is missing).
    #[error(
        "the epoch record in etcd ({}) and the durable record ({}) disagree",
        epoch_shown(*.etcd),
        epoch_shown(*.durable)
    )]
    Records {
        /// The epoch in etcd, if any.
        etcd: Option<Epoch>,
        /// The epoch in the durable record, if any.
        durable: Option<Epoch>,
    },
    /// The epoch changed under the acquire. If this locker advanced it, or another
    /// locker did and both records agree on the new epoch (adopted), the acquire is
    /// retried under the new epoch and this is only seen if that keeps happening;
    /// otherwise this locker refuses grants until the records agree
    /// ([`Locker::epoch`](crate::Locker::epoch) reports it).
    #[error("the epoch was advanced while acquiring")]
    Advanced,
}

/// The error of every fallible operation in this crate.
///
/// Classify with the query methods (`is_not_held()`, `is_epoch_mismatch()`...) or
/// [`Error::kind`]; the underlying etcd or I/O error, if any, is the [`source`](std::error::Error::source).
pub struct Error {
    kind: ErrorKind,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Error { kind, source: None }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error {
            kind,
            source: Some(source.into()),
        }
    }

    pub(crate) fn invalid(reason: InvalidInput) -> Self {
        Error::new(ErrorKind::InvalidInput(reason))
    }

    pub(crate) fn epoch(reason: EpochMismatch) -> Self {
        Error::new(ErrorKind::EpochMismatch(reason))
    }

    /// The kind of error.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// Input was refused; nothing was written.
    pub fn is_invalid_input(&self) -> bool {
        matches!(self.kind, ErrorKind::InvalidInput(_))
    }

    /// The reason input was refused, if it was.
    pub fn invalid_input(&self) -> Option<&InvalidInput> {
        match &self.kind {
            ErrorKind::InvalidInput(r) => Some(r),
            _ => None,
        }
    }

    /// The hold is no longer held (expired, force-released or already released).
    pub fn is_not_held(&self) -> bool {
        self.kind == ErrorKind::NotHeld
    }

    /// Grants are refused until the epoch is advanced.
    pub fn is_epoch_mismatch(&self) -> bool {
        matches!(self.kind, ErrorKind::EpochMismatch(_))
    }

    /// etcd could not commit in time and the class fails closed.
    pub fn is_quorum_lost(&self) -> bool {
        self.kind == ErrorKind::QuorumLost
    }

    /// The deadline passed while waiting behind other holders.
    pub fn is_deadline_exceeded(&self) -> bool {
        self.kind == ErrorKind::DeadlineExceeded
    }

    /// The session's lease is gone.
    pub fn is_session_lost(&self) -> bool {
        self.kind == ErrorKind::SessionLost
    }

    /// The namespace's `held_lease_quota` is reached.
    pub fn is_quota_exceeded(&self) -> bool {
        matches!(self.kind, ErrorKind::QuotaExceeded { .. })
    }

    /// The session holds the lock, or waits for it, under another acquire
    /// ([`ErrorKind::AlreadyHeld`], [`ErrorKind::AcquireInFlight`]).
    pub fn is_other_attempt(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::AlreadyHeld { .. } | ErrorKind::AcquireInFlight { .. }
        )
    }

    /// The epoch is at its maximum and cannot be advanced.
    pub fn is_epoch_exhausted(&self) -> bool {
        self.kind == ErrorKind::EpochExhausted
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind);
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::InvalidInput(r) => write!(f, "invalid input: {r}"),
            ErrorKind::NotHeld => {
                f.write_str("the hold is no longer held (expired, force-released or released)")
            }
            ErrorKind::EpochMismatch(r) => write!(
                f,
                "epoch mismatch, grants refused until the epoch is advanced: {r}"
            ),
            ErrorKind::EpochExhausted => write!(
                f,
                "the epoch is already {} (2^15 - 1) and cannot be advanced",
                Epoch::MAX
            ),
            ErrorKind::QuorumLost => f.write_str(
                "etcd could not commit before the deadline (quorum lost or unreachable)",
            ),
            ErrorKind::DeadlineExceeded => {
                f.write_str("deadline exceeded while waiting for the lock")
            }
            ErrorKind::SessionLost => f.write_str("the session's lease is gone"),
            ErrorKind::AlreadyHeld {
                mode,
                grant_rev,
                attempt,
            } => write!(
                f,
                "this session already holds the lock ({} mode, grant_rev {grant_rev}, attempt {attempt}); release it, or name it in replaces if its release's outcome is unknown",
                match mode {
                    Mode::Exclusive => "exclusive",
                    Mode::Shared => "shared",
                }
            ),
            ErrorKind::AcquireInFlight {
                attempt,
                taken_over: false,
            } => write!(
                f,
                "another acquire of this session (attempt {attempt}) is waiting for the lock; a retry of that attempt takes over its place"
            ),
            ErrorKind::AcquireInFlight {
                attempt,
                taken_over: true,
            } => write!(
                f,
                "a retry of this acquire (attempt {attempt}) took over its place in the queue"
            ),
            ErrorKind::Etcd => f.write_str("etcd request failed"),
            ErrorKind::EpochStore => {
                f.write_str("durable epoch record could not be read or written")
            }
            ErrorKind::CorruptRecord => {
                f.write_str("a record under the root prefix could not be decoded")
            }
            ErrorKind::QuotaExceeded { ns, quota } => write!(
                f,
                "held_lease_quota of namespace {ns} reached: {quota} sessions, holds and waits"
            ),
            ErrorKind::SessionLimit { limit } => write!(
                f,
                "this identity already has {limit} open sessions, the service's limit per identity"
            ),
            ErrorKind::NamespaceFenced { ns } => write!(
                f,
                "namespace {ns} is fenced on this etcd cluster (being rehomed, or it lives on another tier)"
            ),
            ErrorKind::WrongTier { ns, tier } => write!(
                f,
                "namespace {ns} lives on tier {tier}: open the session on tier {tier}"
            ),
            ErrorKind::RehomeInProgress { ns, to } => {
                write!(f, "a rehome of namespace {ns} to tier {to} is in progress")
            }
            ErrorKind::DrainTimeout { ns, holds, waiters } => write!(
                f,
                "namespace {ns} still had {holds} holds and {waiters} waiters on its old tier at the drain deadline; the rehome was rolled back"
            ),
            ErrorKind::SameClusterTiers { a, b, cluster_id } => write!(
                f,
                "tiers {a} and {b} are the same etcd cluster (id {cluster_id:#x})"
            ),
        }
    }
}

impl From<InvalidInput> for Error {
    fn from(reason: InvalidInput) -> Self {
        Error::invalid(reason)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// An epoch record's epoch as messages show it: `epoch N`, or `none` when missing.
fn epoch_shown(epoch: Option<Epoch>) -> String {
    epoch.map_or_else(|| "none".to_owned(), |e| format!("epoch {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_that_disagree_are_named_by_their_epochs() {
        let epoch = |n| Some(Epoch::new(n).unwrap());
        assert_eq!(
            EpochMismatch::Records {
                etcd: epoch(2),
                durable: None
            }
            .to_string(),
            "the epoch record in etcd (epoch 2) and the durable record (none) disagree"
        );
        assert_eq!(
            EpochMismatch::Records {
                etcd: None,
                durable: epoch(0)
            }
            .to_string(),
            "the epoch record in etcd (none) and the durable record (epoch 0) disagree"
        );
    }
}
