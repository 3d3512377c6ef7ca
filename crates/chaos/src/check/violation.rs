//! What the checker reports: [`Violation`]s and the entries that prove them.

use std::fmt;

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

/// One way a history breaks the rules; each names the entries that prove it.
///
/// The first group are the safety rules of the design (issue 7's checks a–e, and f for
/// holds a snapshot restore brought back); the rest say that the history contradicts
/// itself, which a correct system and harness never produce.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// (a) Two committed writes of one resource whose tokens decrease in the resource's
    /// commit order: `earlier.seq < later.seq` but `earlier.token > later.token`.
    CommitOrder {
        /// The resource.
        resource: ResourceId,
        /// The write committed first, with the larger token.
        earlier: WriteRef,
        /// The write committed after it, with the smaller token.
        later: WriteRef,
    },
    /// (a) Two committed writes of one resource with the same commit sequence number: one
    /// of them was lost.
    SeqReused {
        /// The resource.
        resource: ResourceId,
        /// The write recorded first.
        first: WriteRef,
        /// The write recorded second.
        second: WriteRef,
    },
    /// (a) A write committed at a sequence number at or below that of a write which had
    /// already completed before this one was invoked: the resource's commit order
    /// contradicts real time.
    CommitBeforeInvocation {
        /// The resource.
        resource: ResourceId,
        /// The write.
        write: WriteRef,
        /// Its `write_invoked` entry.
        invoked: EntryIndex,
        /// The write that had completed before it was invoked.
        completed_before: WriteRef,
    },
    /// (b) A write admitted with a token below the resource's mark, where the mark was
    /// known before the write was invoked.
    StaleWriteAdmitted {
        /// The resource.
        resource: ResourceId,
        /// The admitted write.
        write: WriteRef,
        /// Its `write_invoked` entry.
        invoked: EntryIndex,
        /// What set the mark before it.
        mark: Mark,
    },
    /// (c) Two holds of one lock in one epoch that overlap in etcd's revision order, where
    /// at least one is exclusive.
    HoldsOverlap {
        /// The lock.
        lock: LockName,
        /// The epoch both were granted in.
        epoch: u16,
        /// The hold granted first.
        first: HoldRef,
        /// The hold granted while `first` was still held.
        second: HoldRef,
    },
    /// (f) A hold granted in a restored cluster's revision space while a hold the restore
    /// brought back of the same lock was still present there (or two restored holds of
    /// one lock), where at least one is exclusive.
    RestoredHoldOverlap {
        /// The lock.
        lock: LockName,
        /// The revision space (the `n`-th restore made it).
        space: u32,
        /// The restored hold (its own grant and end revisions).
        restored: HoldRef,
        /// The snapshot's revision, from which the restored hold was present.
        restored_rev: i64,
        /// The hold granted in the space while `restored` was present (or another
        /// restored hold).
        hold: HoldRef,
    },
    /// (f) A hold granted in a restored cluster's revision space whose epoch is not above
    /// the epoch of a hold the restore brought back: the epoch was not advanced past it.
    RestoredHoldNotOlder {
        /// The revision space.
        space: u32,
        /// The restored hold's lock.
        restored_lock: LockName,
        /// The restored hold of the highest epoch in the space.
        restored: HoldRef,
        /// Its epoch.
        restored_epoch: u16,
        /// The lock of the hold granted in the space.
        lock: LockName,
        /// The hold granted in the space.
        hold: HoldRef,
        /// Its epoch.
        epoch: u16,
    },
    /// (g) A hold etcd's history shows force-released by a request that did not name
    /// it: the request is unknown, is about another lock, or its targets (fixed when it
    /// was made) do not include the hold's grant revision.
    ForcedOutsideTargets {
        /// The lock.
        lock: LockName,
        /// The `etcd_forced` entry.
        forced: EntryIndex,
        /// The forced hold's grant revision.
        grant_rev: i64,
        /// The request its force marker names.
        request_id: String,
        /// The `force_requested` entry of that request, if there is one.
        request: Option<EntryIndex>,
    },
    /// (g) An approval's answer that etcd's history contradicts: it listed a hold as
    /// released that no force of this request ended, or answered `force-target-gone`
    /// although this request ended a hold.
    ForceAnswerFalse {
        /// The lock.
        lock: LockName,
        /// The `force_approved` entry.
        approval: EntryIndex,
        /// The request.
        request_id: String,
        /// The grant revision the answer listed as released (`None` for
        /// `force-target-gone`).
        grant_rev: Option<i64>,
        /// The `etcd_forced` entry that contradicts a `force-target-gone`.
        forced: Option<EntryIndex>,
    },
    /// (g) A worker whose hold was force-released was never told: no `lost` entry of it
    /// for that token (or one naming another request), or it recorded the hold as
    /// released.
    ForcedHoldNotTold {
        /// The lock.
        lock: LockName,
        /// The `etcd_forced` entry.
        forced: EntryIndex,
        /// The worker's `granted` entry of the hold.
        grant: EntryIndex,
        /// The worker.
        worker: u32,
        /// A `released` entry of the hold, or a `lost` naming another request.
        told_wrong: Option<EntryIndex>,
    },
    /// (h) A release the worker saw succeed, or one reported outcome-unknown, did not end
    /// its hold while the session lived on: the session was granted another hold
    /// (`later`) while this one was still held (for an outcome-unknown release: and the
    /// hold then stayed until the session expired, or to the end of the history).
    ReleaseLeftHeld {
        /// The lock.
        lock: LockName,
        /// The worker's `released` or `release_unknown` entry.
        release: EntryIndex,
        /// The hold, as etcd's history shows it.
        hold: EntryIndex,
        /// A later hold of the same session granted while `hold` was held.
        later: EntryIndex,
        /// Whether the release was reported outcome-unknown.
        unknown: bool,
    },
    /// (d) An epoch advanced to a value not above the epoch before it.
    EpochNotIncreasing {
        /// The previous advance.
        previous: EpochRef,
        /// This advance.
        next: EpochRef,
    },
    /// (d) A grant whose acquire began after an epoch was advanced carries an older epoch.
    TokenFromOldEpoch {
        /// The lock.
        lock: LockName,
        /// The grant.
        grant: GrantRef,
        /// Its `acquire_invoked` entry.
        acquire: EntryIndex,
        /// The advance recorded before the acquire.
        advanced: EpochRef,
    },
    /// (d) A grant whose token is not above a token granted before its acquire began.
    /// Tokens are the epoch over the cluster-wide etcd revision, so every later grant, of
    /// any lock, must carry a larger token.
    TokenNotIncreasing {
        /// The lock.
        lock: LockName,
        /// The grant.
        grant: GrantRef,
        /// Its `acquire_invoked` entry.
        acquire: EntryIndex,
        /// The larger or equal token granted before the acquire began.
        earlier: GrantRef,
    },
    /// (d) A grant whose token's revision is not its `grant_rev`.
    TokenNotFromGrant {
        /// The lock.
        lock: LockName,
        /// The grant.
        grant: GrantRef,
        /// The `grant_rev` it names.
        grant_rev: i64,
    },
    /// (e) Something the audit trail must record once is recorded fewer times.
    AuditMissing {
        /// What is missing.
        record: AuditRecord,
        /// The entry that shows it happened (an `etcd_hold` or a `write_completed`).
        evidence: EntryIndex,
        /// How many rows there must be at least.
        expected: usize,
        /// The rows found.
        rows: Vec<EntryIndex>,
    },
    /// (e) Something recorded more often than it happened.
    AuditDuplicate {
        /// What is recorded twice.
        record: AuditRecord,
        /// How many rows there may be at most.
        allowed: usize,
        /// Every row recording it.
        rows: Vec<EntryIndex>,
    },
    /// (e) An audit row for something the history does not show, or that names a
    /// revision the history contradicts.
    AuditUnexpected {
        /// The `audit_row` entry.
        row: EntryIndex,
        /// What it claims, when it names a hold or a resource.
        record: Option<AuditRecord>,
    },
    /// A `write_completed` with no open `write_invoked` of the same `op`.
    CompletionWithoutInvocation {
        /// The entry.
        entry: EntryIndex,
        /// Its `op`.
        op: u64,
    },
    /// A `write_completed` whose resource, target or token differ from its invocation's.
    CompletionDiffers {
        /// The `write_invoked` entry.
        invoked: EntryIndex,
        /// The `write_completed` entry.
        completed: EntryIndex,
        /// The `op`.
        op: u64,
    },
    /// A `write_invoked` reusing an `op` already invoked.
    OpReused {
        /// The first invocation.
        first: EntryIndex,
        /// This invocation.
        second: EntryIndex,
        /// The `op`.
        op: u64,
    },
    /// A write carrying a token that no `granted` or `etcd_hold` entry shows.
    UnknownToken {
        /// The `write_invoked` entry (the first one with this token).
        write: EntryIndex,
        /// The token.
        token: u64,
    },
    /// A write refused as stale although its token was at or above the mark the
    /// resource reported (the fence refuses only tokens below the mark).
    UnjustifiedRejection {
        /// The resource.
        resource: ResourceId,
        /// The refused write.
        write: WriteRef,
        /// The mark it reported.
        highest: u64,
    },
    /// A `granted` with no open `acquire_invoked` of the same worker and lock.
    GrantWithoutAcquire {
        /// The lock.
        lock: LockName,
        /// The grant.
        grant: GrantRef,
    },
    /// An entry that cannot be checked as written.
    MalformedEntry {
        /// The entry.
        entry: EntryIndex,
        /// What is wrong.
        problem: EntryProblem,
    },
    /// An entry recorded earlier (`at_ns`) than an entry already checked, beyond the
    /// reader's reorder window: the history is not in time order, so real-time checks
    /// around it are unreliable.
    OutOfOrder {
        /// The entry.
        entry: EntryIndex,
        /// Its `at_ns`.
        at_ns: u64,
        /// The latest `at_ns` already checked.
        after_ns: u64,
    },
}

/// The kind of a [`Violation`], without its evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[allow(missing_docs)] // One per `Violation` variant, documented there.
pub enum ViolationKind {
    CommitOrder,
    SeqReused,
    CommitBeforeInvocation,
    StaleWriteAdmitted,
    HoldsOverlap,
    RestoredHoldOverlap,
    RestoredHoldNotOlder,
    EpochNotIncreasing,
    TokenFromOldEpoch,
    TokenNotIncreasing,
    TokenNotFromGrant,
    AuditMissing,
    AuditDuplicate,
    AuditUnexpected,
    CompletionWithoutInvocation,
    CompletionDiffers,
    OpReused,
    UnknownToken,
    UnjustifiedRejection,
    GrantWithoutAcquire,
    MalformedEntry,
    OutOfOrder,
    ForcedOutsideTargets,
    ForceAnswerFalse,
    ForcedHoldNotTold,
    ReleaseLeftHeld,
}

impl Violation {
    /// This violation's kind.
    pub fn kind(&self) -> ViolationKind {
        match self {
            Violation::CommitOrder { .. } => ViolationKind::CommitOrder,
            Violation::SeqReused { .. } => ViolationKind::SeqReused,
            Violation::CommitBeforeInvocation { .. } => ViolationKind::CommitBeforeInvocation,
            Violation::StaleWriteAdmitted { .. } => ViolationKind::StaleWriteAdmitted,
            Violation::HoldsOverlap { .. } => ViolationKind::HoldsOverlap,
            Violation::RestoredHoldOverlap { .. } => ViolationKind::RestoredHoldOverlap,
            Violation::RestoredHoldNotOlder { .. } => ViolationKind::RestoredHoldNotOlder,
            Violation::EpochNotIncreasing { .. } => ViolationKind::EpochNotIncreasing,
            Violation::TokenFromOldEpoch { .. } => ViolationKind::TokenFromOldEpoch,
            Violation::TokenNotIncreasing { .. } => ViolationKind::TokenNotIncreasing,
            Violation::TokenNotFromGrant { .. } => ViolationKind::TokenNotFromGrant,
            Violation::AuditMissing { .. } => ViolationKind::AuditMissing,
            Violation::AuditDuplicate { .. } => ViolationKind::AuditDuplicate,
            Violation::AuditUnexpected { .. } => ViolationKind::AuditUnexpected,
            Violation::CompletionWithoutInvocation { .. } => {
                ViolationKind::CompletionWithoutInvocation
            }
            Violation::CompletionDiffers { .. } => ViolationKind::CompletionDiffers,
            Violation::OpReused { .. } => ViolationKind::OpReused,
            Violation::UnknownToken { .. } => ViolationKind::UnknownToken,
            Violation::UnjustifiedRejection { .. } => ViolationKind::UnjustifiedRejection,
            Violation::GrantWithoutAcquire { .. } => ViolationKind::GrantWithoutAcquire,
            Violation::MalformedEntry { .. } => ViolationKind::MalformedEntry,
            Violation::OutOfOrder { .. } => ViolationKind::OutOfOrder,
            Violation::ForcedOutsideTargets { .. } => ViolationKind::ForcedOutsideTargets,
            Violation::ForceAnswerFalse { .. } => ViolationKind::ForceAnswerFalse,
            Violation::ForcedHoldNotTold { .. } => ViolationKind::ForcedHoldNotTold,
            Violation::ReleaseLeftHeld { .. } => ViolationKind::ReleaseLeftHeld,
        }
    }

    /// Every entry this violation names, in no particular order.
    pub fn entries(&self) -> Vec<EntryIndex> {
        match self {
            Violation::CommitOrder {
                earlier: a,
                later: b,
                ..
            }
            | Violation::SeqReused {
                first: a,
                second: b,
                ..
            } => {
                vec![a.entry, b.entry]
            }
            Violation::CommitBeforeInvocation {
                write,
                invoked,
                completed_before,
                ..
            } => {
                vec![write.entry, *invoked, completed_before.entry]
            }
            Violation::StaleWriteAdmitted {
                write,
                invoked,
                mark,
                ..
            } => {
                let mark = match mark {
                    Mark::Committed(w) | Mark::Reported { write: w, .. } => w.entry,
                };
                vec![write.entry, *invoked, mark]
            }
            Violation::HoldsOverlap { first, second, .. } => vec![first.entry, second.entry],
            Violation::RestoredHoldOverlap { restored, hold, .. }
            | Violation::RestoredHoldNotOlder { restored, hold, .. } => {
                vec![restored.entry, hold.entry]
            }
            Violation::EpochNotIncreasing { previous, next } => vec![previous.entry, next.entry],
            Violation::TokenFromOldEpoch {
                grant,
                acquire,
                advanced,
                ..
            } => {
                vec![grant.entry, *acquire, advanced.entry]
            }
            Violation::TokenNotIncreasing {
                grant,
                acquire,
                earlier,
                ..
            } => {
                vec![grant.entry, *acquire, earlier.entry]
            }
            Violation::TokenNotFromGrant { grant, .. }
            | Violation::GrantWithoutAcquire { grant, .. } => {
                vec![grant.entry]
            }
            Violation::AuditMissing { evidence, rows, .. } => {
                let mut all = vec![*evidence];
                all.extend(rows);
                all
            }
            Violation::AuditDuplicate { rows, .. } => rows.clone(),
            Violation::AuditUnexpected { row, .. } => vec![*row],
            Violation::CompletionWithoutInvocation { entry, .. }
            | Violation::MalformedEntry { entry, .. }
            | Violation::OutOfOrder { entry, .. } => vec![*entry],
            Violation::CompletionDiffers {
                invoked, completed, ..
            } => vec![*invoked, *completed],
            Violation::OpReused { first, second, .. } => vec![*first, *second],
            Violation::UnknownToken { write, .. } => vec![*write],
            Violation::UnjustifiedRejection { write, .. } => vec![write.entry],
            Violation::ForcedOutsideTargets {
                forced, request, ..
            } => std::iter::once(*forced).chain(*request).collect(),
            Violation::ForceAnswerFalse {
                approval, forced, ..
            } => std::iter::once(*approval).chain(*forced).collect(),
            Violation::ForcedHoldNotTold {
                forced,
                grant,
                told_wrong,
                ..
            } => [*forced, *grant].into_iter().chain(*told_wrong).collect(),
            Violation::ReleaseLeftHeld {
                release,
                hold,
                later,
                ..
            } => vec![*release, *hold, *later],
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::CommitOrder { resource, earlier, later } => write!(
                f,
                "{resource}: tokens decrease in commit order: {earlier} committed before {later}"
            ),
            Violation::SeqReused { resource, first, second } => {
                write!(f, "{resource}: two writes committed at one sequence number: {first} and {second}")
            }
            Violation::CommitBeforeInvocation { resource, write, invoked, completed_before } => write!(
                f,
                "{resource}: {write} (invoked at {invoked}) committed no later than {completed_before}, \
                 which had completed before it was invoked"
            ),
            Violation::StaleWriteAdmitted { resource, write, invoked, mark } => write!(
                f,
                "{resource}: stale write admitted: {write} committed below the mark {}; before it was \
                 invoked ({invoked}), {mark}",
                TokenDisplay(mark.token())
            ),
            Violation::HoldsOverlap { lock, epoch, first, second } => write!(
                f,
                "{}: holds overlap in epoch {epoch}: {second} was granted while {first} was held",
                LockDisplay(lock)
            ),
            Violation::RestoredHoldOverlap { lock, space, restored, restored_rev, hold } => write!(
                f,
                "{}: in revision space {space}, {hold} overlaps the {restored} that the restore from \
                 revision {restored_rev} brought back",
                LockDisplay(lock)
            ),
            Violation::RestoredHoldNotOlder { space, restored_lock, restored, restored_epoch, lock, hold, epoch } => {
                write!(
                    f,
                    "{}: in revision space {space}, {hold} was granted in epoch {epoch}, not above epoch \
                     {restored_epoch} of the {restored} of {} that the restore brought back",
                    LockDisplay(lock),
                    LockDisplay(restored_lock)
                )
            }
            Violation::EpochNotIncreasing { previous, next } => write!(
                f,
                "epoch advanced to {} ({}) after {} ({}): epochs must increase",
                next.epoch, next.entry, previous.epoch, previous.entry
            ),
            Violation::TokenFromOldEpoch { lock, grant, acquire, advanced } => write!(
                f,
                "{}: {grant} is from an old epoch: its acquire ({acquire}) began after epoch {} was \
                 advanced ({})",
                LockDisplay(lock),
                advanced.epoch,
                advanced.entry
            ),
            Violation::TokenNotIncreasing { lock, grant, acquire, earlier } => write!(
                f,
                "{}: {grant} is not above {earlier}, granted before its acquire began ({acquire})",
                LockDisplay(lock)
            ),
            Violation::TokenNotFromGrant { lock, grant, grant_rev } => write!(
                f,
                "{}: {grant} does not carry its grant revision {grant_rev}",
                LockDisplay(lock)
            ),
            Violation::AuditMissing { record, evidence, expected, rows } => write!(
                f,
                "audit: {record} ({evidence}) is recorded {} time(s), expected {expected}{}",
                rows.len(),
                EntryList(rows)
            ),
            Violation::AuditDuplicate { record, allowed, rows } => write!(
                f,
                "audit: {record} is recorded {} times, at most {allowed} expected{}",
                rows.len(),
                EntryList(rows)
            ),
            Violation::AuditUnexpected { row, record: Some(record) } => {
                write!(f, "audit: {row} records {record}, which the history does not show")
            }
            Violation::AuditUnexpected { row, record: None } => {
                write!(f, "audit: {row} matches nothing in the history")
            }
            Violation::CompletionWithoutInvocation { entry, op } => {
                write!(f, "{entry}: write op {op} completed without an open invocation")
            }
            Violation::CompletionDiffers { invoked, completed, op } => write!(
                f,
                "write op {op}: its completion ({completed}) names another resource, target or token \
                 than its invocation ({invoked})"
            ),
            Violation::OpReused { first, second, op } => {
                write!(f, "write op {op} invoked twice: {first} and {second}")
            }
            Violation::UnknownToken { write, token } => {
                write!(f, "{write}: a write carries token {}, which was never granted", TokenDisplay(*token))
            }
            Violation::UnjustifiedRejection { resource, write, highest } => write!(
                f,
                "{resource}: {write} was refused as stale with the mark at {}, not above its token",
                TokenDisplay(*highest)
            ),
            Violation::GrantWithoutAcquire { lock, grant } => {
                write!(f, "{}: {grant} without an acquire", LockDisplay(lock))
            }
            Violation::MalformedEntry { entry, problem } => write!(f, "{entry}: {problem}"),
            Violation::ForcedOutsideTargets { lock, forced, grant_rev, request_id, request: Some(request) } => write!(
                f,
                "{}: the hold granted at revision {grant_rev} was force-released ({forced}) by request \
                 {request_id}, whose targets ({request}) did not name it",
                LockDisplay(lock)
            ),
            Violation::ForcedOutsideTargets { lock, forced, grant_rev, request_id, request: None } => write!(
                f,
                "{}: the hold granted at revision {grant_rev} was force-released ({forced}) by request \
                 {request_id}, which was never made",
                LockDisplay(lock)
            ),
            Violation::ForceAnswerFalse { lock, approval, request_id, grant_rev: Some(rev), .. } => write!(
                f,
                "{}: the approval of request {request_id} ({approval}) says it released the hold granted \
                 at revision {rev}, which no force of that request ended",
                LockDisplay(lock)
            ),
            Violation::ForceAnswerFalse { lock, approval, request_id, forced, .. } => write!(
                f,
                "{}: the approval of request {request_id} ({approval}) answered force-target-gone, but \
                 the request ended a hold{}",
                LockDisplay(lock),
                EntryList(&forced.iter().copied().collect::<Vec<_>>())
            ),
            Violation::ForcedHoldNotTold { lock, forced, grant, worker, told_wrong } => {
                write!(
                    f,
                    "{}: worker {worker}'s hold ({grant}) was force-released ({forced}) and the worker \
                     was not told",
                    LockDisplay(lock)
                )?;
                match told_wrong {
                    Some(e) => write!(f, ": {e} says otherwise"),
                    None => Ok(()),
                }
            }
            Violation::ReleaseLeftHeld { lock, release, hold, later, unknown } => write!(
                f,
                "{}: the {} release ({release}) of the hold {hold} did not end it while its session \
                 lived on: {later} was granted to the session while it was held",
                LockDisplay(lock),
                if *unknown { "outcome-unknown" } else { "acknowledged" }
            ),
            Violation::OutOfOrder { entry, at_ns, after_ns } => write!(
                f,
                "{entry}: recorded at {at_ns} ns, before {after_ns} ns already checked: the history is \
                 not in time order"
            ),
        }
    }
}

/// A token as `epoch:revision (raw)`, readable and exact.
pub(crate) struct TokenDisplay(pub(crate) u64);

impl fmt::Display for TokenDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (epoch {}, rev {})",
            self.0,
            self.0 >> 48,
            self.0 & ((1 << 48) - 1)
        )
    }
}

pub(crate) struct LockDisplay<'a>(pub(crate) &'a LockName);

impl fmt::Display for LockDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.0.ns, self.0.class, self.0.key)
    }
}

struct EntryList<'a>(&'a [EntryIndex]);

impl fmt::Display for EntryList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { ", " })?;
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
