//! What the checker reports: [`Violation`]s and the entries that prove them.

use crate::history::LockName;

pub use super::refs::{
    AuditRecord, EntryIndex, EntryProblem, EpochRef, GrantRef, HoldRef, LockRecordKind, Mark,
    ResourceId, WriteRef,
};

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
    /// (i) Two holds of one lock on two tiers (etcd clusters) that overlap in real time:
    /// the revision marks show each granted before the other ended, where at least one
    /// is exclusive. A rehome must drain the old tier before the new one grants.
    TierHoldsOverlap {
        /// The lock.
        lock: LockName,
        /// One hold (revisions of its own tier).
        first: HoldRef,
        /// Its tier (`None`: the home tier).
        first_tier: Option<String>,
        /// The other hold.
        second: HoldRef,
        /// Its tier.
        second_tier: Option<String>,
    },
    /// (i) A hold granted after a hold of the same lock on another tier had ended (as
    /// the revision marks show), whose token is not above that hold's: a rehome did not
    /// put the new tier's tokens above the old tier's.
    TierTokenNotAbove {
        /// The lock.
        lock: LockName,
        /// The hold that ended first.
        earlier: HoldRef,
        /// Its tier (`None`: the home tier).
        earlier_tier: Option<String>,
        /// Its token.
        earlier_token: u64,
        /// The hold granted after it ended.
        later: HoldRef,
        /// Its tier.
        later_tier: Option<String>,
        /// Its token, at or below `earlier_token`.
        later_token: u64,
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
    /// (j) A hold a worker was granted (a 200 to its acquire) that etcd's history shows
    /// released, although the worker neither released it (nor gave it up) nor was told
    /// it was lost: the hold was deleted on the holder's behalf, typically by another
    /// acquire of its session, and nothing tells the holder, who writes on.
    HoldEndedUntold {
        /// The lock.
        lock: LockName,
        /// The hold, as etcd's history shows it (its end revision is the delete).
        hold: HoldRef,
        /// The worker's `granted` entry of the hold.
        grant: EntryIndex,
        /// The worker.
        worker: u32,
        /// The worker's `lost` entry with reason `not_held`, if any: it found out only
        /// afterwards, when its own release was refused.
        found_out: Option<EntryIndex>,
    },
    /// (i) A worker was not told its hold was lost in time: while the hold was open, the
    /// worker recorded `late` after its session's expiry plus the slack (and after any
    /// pause of it across the expiry).
    LossSignalLate {
        /// The lock.
        lock: LockName,
        /// The worker.
        worker: u32,
        /// The worker's `granted` entry of the hold.
        grant: EntryIndex,
        /// The session's expiry: its last acknowledged renewal's send time plus its TTL,
        /// ns on the history's clock.
        expiry_ns: u64,
        /// The deadline the signal missed, ns.
        deadline_ns: u64,
        /// The worker's first entry after the deadline (its late `lost`, or anything
        /// else it recorded while it went untold).
        late: EntryIndex,
    },
    /// (i) A worker invoked a write carrying a token after it recorded that token's hold
    /// lost.
    WriteAfterLoss {
        /// The worker.
        worker: u32,
        /// The lost hold's token.
        token: u64,
        /// The worker's `lost` entry.
        lost: EntryIndex,
        /// The write invoked after it.
        write: EntryIndex,
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
    TierHoldsOverlap,
    TierTokenNotAbove,
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
    HoldEndedUntold,
    LossSignalLate,
    WriteAfterLoss,
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
            Violation::TierHoldsOverlap { .. } => ViolationKind::TierHoldsOverlap,
            Violation::TierTokenNotAbove { .. } => ViolationKind::TierTokenNotAbove,
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
            Violation::HoldEndedUntold { .. } => ViolationKind::HoldEndedUntold,
            Violation::LossSignalLate { .. } => ViolationKind::LossSignalLate,
            Violation::WriteAfterLoss { .. } => ViolationKind::WriteAfterLoss,
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
            Violation::HoldsOverlap { first, second, .. }
            | Violation::TierHoldsOverlap { first, second, .. } => vec![first.entry, second.entry],
            Violation::TierTokenNotAbove { earlier, later, .. } => {
                vec![earlier.entry, later.entry]
            }
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
            Violation::HoldEndedUntold {
                hold,
                grant,
                found_out,
                ..
            } => [hold.entry, *grant].into_iter().chain(*found_out).collect(),
            Violation::LossSignalLate { grant, late, .. } => vec![*grant, *late],
            Violation::WriteAfterLoss { lost, write, .. } => vec![*lost, *write],
        }
    }
}
