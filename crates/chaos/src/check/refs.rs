//! The evidence a [`Violation`](super::Violation) names: entries, writes, holds, grants,
//! epochs and audit records.

use std::fmt;

use super::violation_text::{LockDisplay, TokenDisplay};
use crate::history::{HoldEnd, LockName, Target};

/// The position of an entry in the history, 0-based.
///
/// For [`check`](super::check) it is the index into the slice; for
/// [`check_reader`](super::check_reader) it counts the entries read (blank lines are not
/// entries). A history written by [`write_entry`](crate::history::write_entry) has entry `i`
/// on line `i + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryIndex(pub usize);

impl fmt::Display for EntryIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "entry #{}", self.0)
    }
}

/// One resource: a `(target, resource)` pair. A Postgres row and an HTTP path with the
/// same name are two resources, each with its own high-water mark and commit order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceId {
    /// Where the resource lives.
    pub target: Target,
    /// The row id or HTTP path.
    pub resource: String,
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match self.target {
            Target::Postgres => "postgres",
            Target::Http => "http",
        };
        write!(f, "{target}:{}", self.resource)
    }
}

/// A write attempt, named by its completion entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRef {
    /// The `write_completed` entry.
    pub entry: EntryIndex,
    /// The attempt's `op`.
    pub op: u64,
    /// The worker that made it.
    pub worker: u32,
    /// The token it carried.
    pub token: Option<u64>,
    /// The resource's commit sequence number, for a committed write.
    pub seq: Option<u64>,
}

impl fmt::Display for WriteRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "op {} of worker {} ({}",
            self.op, self.worker, self.entry
        )?;
        match self.token {
            Some(t) => write!(f, ", token {}", TokenDisplay(t))?,
            None => write!(f, ", no token")?,
        }
        if let Some(seq) = self.seq {
            write!(f, ", seq {seq}")?;
        }
        write!(f, ")")
    }
}

/// What told the checker a resource's high-water mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// A write with this token committed.
    Committed(WriteRef),
    /// The resource refused a write and reported its mark as `highest`.
    Reported {
        /// The refused write.
        write: WriteRef,
        /// The mark it reported.
        highest: u64,
    },
}

impl Mark {
    /// The mark's token value.
    pub fn token(&self) -> u64 {
        match self {
            Mark::Committed(w) => w.token.unwrap_or(0),
            Mark::Reported { highest, .. } => *highest,
        }
    }
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mark::Committed(w) => write!(f, "{w} had committed"),
            Mark::Reported { write, highest } => {
                write!(
                    f,
                    "the refusal of {write} had reported the mark {}",
                    TokenDisplay(*highest)
                )
            }
        }
    }
}

/// A hold as etcd's history shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRef {
    /// The `etcd_hold` entry.
    pub entry: EntryIndex,
    /// The hold key's create revision.
    pub grant_rev: i64,
    /// The revision that ended it; `None` while open.
    pub end_rev: Option<i64>,
    /// Exclusive or shared.
    pub exclusive: bool,
}

impl fmt::Display for HoldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.exclusive { "X" } else { "S" };
        match self.end_rev {
            Some(end) => write!(
                f,
                "{mode} hold [{}, {end}) ({})",
                self.grant_rev, self.entry
            ),
            None => write!(f, "{mode} hold [{}, open) ({})", self.grant_rev, self.entry),
        }
    }
}

/// A grant a worker saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRef {
    /// The `granted` entry.
    pub entry: EntryIndex,
    /// The worker it was granted to.
    pub worker: u32,
    /// The token.
    pub token: u64,
}

impl fmt::Display for GrantRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "token {} to worker {} ({})",
            TokenDisplay(self.token),
            self.worker,
            self.entry
        )
    }
}

/// An `epoch_advanced` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochRef {
    /// The entry.
    pub entry: EntryIndex,
    /// The epoch it advanced to.
    pub epoch: u16,
}

/// The kinds of lock events the audit trail records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockRecordKind {
    /// `grant`.
    Grant,
    /// `release`.
    Release,
    /// `expire`.
    Expire,
    /// `force`.
    Force,
    /// `force_release`: the lock service's own record of a force release (who asked,
    /// who approved, which grant), one per forced hold.
    ForceRecord,
}

impl LockRecordKind {
    /// The `kind` string of an `audit_row` entry.
    pub fn as_str(self) -> &'static str {
        match self {
            LockRecordKind::Grant => "grant",
            LockRecordKind::Release => "release",
            LockRecordKind::Expire => "expire",
            LockRecordKind::Force => "force",
            LockRecordKind::ForceRecord => "force_release",
        }
    }

    /// The audit kind that records a hold's end, `None` for a hold still open.
    pub fn of_end(end: HoldEnd) -> Option<Self> {
        match end {
            HoldEnd::Released => Some(LockRecordKind::Release),
            HoldEnd::Expired => Some(LockRecordKind::Expire),
            HoldEnd::Forced => Some(LockRecordKind::Force),
            HoldEnd::Open => None,
        }
    }
}

/// One thing the audit trail must record exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AuditRecord {
    /// A lock event of the hold with this token.
    Lock {
        /// Which event.
        kind: LockRecordKind,
        /// The lock.
        lock: LockName,
        /// The hold's token.
        token: u64,
    },
    /// A write to this resource without a token (the audit's `unprotected_write`).
    UnprotectedWrite {
        /// The resource.
        resource: String,
    },
}

impl fmt::Display for AuditRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuditRecord::Lock { kind, lock, token } => {
                write!(
                    f,
                    "{} of {} with token {}",
                    kind.as_str(),
                    LockDisplay(lock),
                    TokenDisplay(*token)
                )
            }
            AuditRecord::UnprotectedWrite { resource } => {
                write!(f, "unprotected write to {resource}")
            }
        }
    }
}

/// What is wrong with an entry that cannot be checked as written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryProblem {
    /// An `etcd_hold` whose `end` and `end_rev` disagree (an end revision for an open
    /// hold, or none for an ended one).
    HoldEndMismatch {
        /// The entry's `end`.
        end: HoldEnd,
        /// The entry's `end_rev`.
        end_rev: Option<i64>,
    },
    /// An `etcd_hold` that ends at or before its grant revision.
    HoldEndsBeforeGrant,
    /// A revision outside `0..2^48`, which no token can carry.
    RevisionOutOfRange(i64),
    /// An `audit_row` whose `kind` is none of `grant`, `release`, `expire`, `force`,
    /// `unprotected_write` (a `gap` row means the audit trail missed events).
    UnknownAuditKind(String),
    /// A lock event `audit_row` without its lock, or without both token and revision.
    AuditRowWithoutLock,
    /// An `unprotected_write` `audit_row` without its resource.
    AuditRowWithoutResource,
    /// A `restored_hold` granted above the revision of the snapshot it came back from.
    RestoredAfterSnapshot,
    /// A `restored_hold` that ends at or before the snapshot's revision, before the
    /// restored cluster started.
    HoldEndsBeforeRestore,
}

impl fmt::Display for EntryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryProblem::HoldEndMismatch { end, end_rev } => {
                write!(
                    f,
                    "etcd hold ends {end:?} but its end revision is {end_rev:?}"
                )
            }
            EntryProblem::HoldEndsBeforeGrant => {
                write!(f, "etcd hold ends at or before its grant revision")
            }
            EntryProblem::RevisionOutOfRange(rev) => write!(f, "revision {rev} is outside 0..2^48"),
            EntryProblem::UnknownAuditKind(kind) => write!(f, "audit row of unknown kind {kind:?}"),
            EntryProblem::AuditRowWithoutLock => {
                write!(
                    f,
                    "lock audit row without its lock, or without both token and revision"
                )
            }
            EntryProblem::AuditRowWithoutResource => {
                write!(f, "unprotected-write audit row without its resource")
            }
            EntryProblem::RestoredAfterSnapshot => {
                write!(
                    f,
                    "restored hold granted above the revision of the snapshot it came back from"
                )
            }
            EntryProblem::HoldEndsBeforeRestore => {
                write!(f, "restored hold ends at or before the revision of the snapshot it came back from")
            }
        }
    }
}
