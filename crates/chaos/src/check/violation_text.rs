//! How a [`Violation`] reads.

use std::fmt;

use super::refs::EntryIndex;
use super::violation::Violation;
use crate::history::LockName;

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
            Violation::TierHoldsOverlap { lock, first, first_tier, second, second_tier } => write!(
                f,
                "{}: holds on two tiers overlap in real time: {first} on {} and {second} on {}",
                LockDisplay(lock),
                TierDisplay(first_tier),
                TierDisplay(second_tier)
            ),
            Violation::TierTokenNotAbove {
                lock,
                earlier,
                earlier_tier,
                earlier_token,
                later,
                later_tier,
                later_token,
            } => write!(
                f,
                "{}: {later} on {} was granted after {earlier} on {} had ended, with token {} not                  above {}",
                LockDisplay(lock),
                TierDisplay(later_tier),
                TierDisplay(earlier_tier),
                TokenDisplay(*later_token),
                TokenDisplay(*earlier_token)
            ),
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
            Violation::HoldEndedUntold { lock, hold, grant, worker, found_out } => {
                write!(
                    f,
                    "{}: worker {worker}'s hold ({grant}), the {hold}, was deleted as released, but the \
                     worker neither released it nor was told it was lost",
                    LockDisplay(lock)
                )?;
                match found_out {
                    Some(e) => write!(f, ": it found out only from its own release refused ({e})"),
                    None => Ok(()),
                }
            }
            Violation::LossSignalLate { lock, worker, grant, expiry_ns, deadline_ns, late } => write!(
                f,
                "{}: worker {worker}'s hold ({grant}) was not reported lost by {deadline_ns} ns (its \
                 session expired at {expiry_ns} ns, plus the slack): {late} is later",
                LockDisplay(lock)
            ),
            Violation::WriteAfterLoss { worker, token, lost, write } => write!(
                f,
                "worker {worker} invoked a write ({write}) with token {} after it was told the hold \
                 was lost ({lost})",
                TokenDisplay(*token)
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

/// A tier as the history names it: `None` is the home tier.
struct TierDisplay<'a>(&'a Option<String>);

impl fmt::Display for TierDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(t) => write!(f, "tier {t}"),
            None => f.write_str("the home tier"),
        }
    }
}

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
