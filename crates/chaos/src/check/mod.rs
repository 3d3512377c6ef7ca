//! The checker: reads a history and reports every way it breaks the safety rules.
//!
//! [`check`] takes a history in memory; [`check_reader`] streams one from a JSON-lines file;
//! [`Checker`] is the engine both drive, one entry at a time. The answer is a
//! [`CheckReport`]: [`Counts`] of what the history contains, and every [`Violation`] with the
//! entries ([`EntryIndex`]) that prove it. A report with no violation means the history is
//! consistent with every rule below, not that the run could not have broken one unseen.
//!
//! # The rules
//!
//! A resource is one `(target, resource)` pair; a lock is one [`LockName`](crate::history::LockName).
//!
//! - **(a) Commit order.** The committed writes of a resource, taken in the resource's own
//!   commit order (`seq`), carry non-decreasing tokens ([`Violation::CommitOrder`]). Two
//!   commits at one `seq` mean a lost write ([`Violation::SeqReused`]); a commit whose `seq`
//!   is not above that of a write which completed before it was invoked contradicts real
//!   time ([`Violation::CommitBeforeInvocation`]).
//! - **(b) No stale admission.** A write invoked after the resource's mark was known (a
//!   write with that token had committed, or a refusal had reported that mark) must not be
//!   committed with a token below it ([`Violation::StaleWriteAdmitted`]). Refusals must be
//!   justified: a token at or above the reported mark is not stale
//!   ([`Violation::UnjustifiedRejection`]).
//! - **(c) Exclusion.** In etcd's history (`etcd_hold`), no two holds of one lock in one epoch,
//!   one tier and one revision space overlap as half-open revision intervals `[grant_rev, end_rev)`
//!   unless both are shared ([`Violation::HoldsOverlap`]). (A restored cluster numbers its
//!   revisions again from the snapshot's, so revisions of two spaces do not order holds.)
//! - **(d) Tokens only grow.** Epochs advance to larger values, one sequence across tiers
//!   ([`Violation::EpochNotIncreasing`]). A grant whose acquire began after an epoch advance
//!   of the tier that granted it (`granted` and `epoch_advanced` name the tier; none names
//!   the home tier) carries that epoch or a later one ([`Violation::TokenFromOldEpoch`]): a
//!   restore advances the restored tier only, and the other tier's grants keep their epoch.
//!   Also, a token above
//!   every token granted before its acquire began, of any lock, since the revision is
//!   cluster-wide and the epoch sits above it ([`Violation::TokenNotIncreasing`]); across a
//!   rehome too, since the new tier's epoch is above every tier's (this compares grants of
//!   every lock, so it assumes the history's locks share one namespace, as the run's do).
//!   A token's
//!   low 48 bits are its `grant_rev` ([`Violation::TokenNotFromGrant`]).
//! - **(e) Audit.** Each grant, release, expiry and forced release of a hold in etcd's
//!   history, and each write committed without a token, has exactly one audit row
//!   ([`Violation::AuditMissing`], [`Violation::AuditDuplicate`],
//!   [`Violation::AuditUnexpected`]); see the rules for holds only a worker saw and for
//!   indeterminate writes below. The events of a revision space above its `audit_cut` (the
//!   last revision the tailer had stored when a restore destroyed the space) went with
//!   the cluster and may have no row; the report counts those without one.
//! - **(f) Restored holds.** A snapshot restore brings back the holds in the snapshot
//!   (`restored_hold`, one per hold key present when the restored cluster starts, in
//!   revision space `n` after the `n`-th restore). In the space's revision order a restored
//!   hold is present from the snapshot's revision until the restored cluster deletes it:
//!   no hold of its lock granted in the space, and no other restored hold of it, overlaps
//!   that unless both are shared ([`Violation::RestoredHoldOverlap`]); and every hold
//!   granted in the space (`etcd_hold` with that `space`) and handed to a worker (a
//!   `granted` entry names its lock, session and token; a grant Txn a locker refused
//!   and deleted mints none) carries an epoch above every restored hold's
//!   ([`Violation::RestoredHoldNotOlder`]). A write carrying a restored
//!   hold's token is held to (b) like any other: once a newer-epoch token was admitted, it
//!   must be refused. Restored holds are outside (e): their grant and first end are
//!   audited from the space that granted them, and the harness leaves the audit trail's
//!   rows about restored history out.
//! - **(g) Force release.** Every hold etcd's history shows force-released
//!   (`etcd_forced`: its grant record rewritten to a marker naming the request) was among
//!   the targets its request named when it was made (`force_requested`)
//!   ([`Violation::ForcedOutsideTargets`]): a hold granted after the request is never
//!   forced. An approval's answer (`force_approved`: the holds it released, or
//!   `force-target-gone`) agrees with etcd's history ([`Violation::ForceAnswerFalse`]).
//!   The worker handed a forced hold records its loss (`lost`, reason forced by that
//!   request, or the session's end), and no acknowledged release of it after the
//!   approval answered ([`Violation::ForcedHoldNotTold`]). How soon it is told is not a
//!   rule: on a loaded machine no bound is robust.
//! - **(h) Releases end holds.** A release the worker saw succeed (`released`) ended its
//!   hold before the session was granted another; one reported outcome-unknown
//!   (`release_unknown`) may land later (the client retries in the background), but the
//!   hold never stays until the session expires or the history ends while the session
//!   was granted another ([`Violation::ReleaseLeftHeld`]). Holds are found by lock and
//!   token, sessions by the `session` of `etcd_hold`.
//! - **(i) Holds across tiers.** A rehome moves a namespace to another tier (etcd cluster).
//!   Per lock, two holds on different tiers (`etcd_hold` with different `tier`) do not
//!   overlap in real time unless both are shared ([`Violation::TierHoldsOverlap`]), and
//!   the one granted after the other ended carries the larger token
//!   ([`Violation::TierTokenNotAbove`]): every token after a move is above every token
//!   before it. Real time comes from the runner's `revision_seen` marks (one tier's
//!   revision read linearizably, with when the read was sent and answered); a rule is
//!   broken only where the marks prove it (see `tiers.rs`).
//! - **(j) Holds end as their holders know.** A hold a worker was handed (`granted`)
//!   that etcd's history shows *released* was released by that worker (`released`,
//!   `release_unknown`, or given up: `abandoned`), or its client had told it the hold
//!   was lost (`lost`, reason other than `not_held`); otherwise it was deleted on the
//!   holder's behalf, typically by another acquire of the same session, and the holder
//!   keeps a 200 that nothing will revoke ([`Violation::HoldEndedUntold`]). Forces and
//!   expiries are told by rules (g) and (i). Holds are joined to grants by lock, token,
//!   session and tier (see `untold.rs`).
//! - **The history itself.** Completions match open invocations with the same resource,
//!   target and token; `op`s are not reused while in flight; every token written was granted
//!   (by a `granted` or an `etcd_hold` entry); every `granted` follows its worker's
//!   `acquire_invoked`; entries are well formed.
//!
//! # Order and real time
//!
//! Safety is decided from the orders the real parts define: `seq` for commits, etcd
//! revisions for holds. Where a rule needs real time ("before it was invoked"), it compares
//! `at_ns`: an entry recorded at `t` happened after everything recorded strictly before `t`;
//! entries at the same nanosecond count as concurrent. This holds because an invocation is
//! recorded before its request is sent and a completion after its answer arrives. The
//! checker never calls concurrent operations ordered, so it never blames a correct system
//! for a race it cannot see.
//!
//! What the rules assume of the run: a resource's `seq` is its real commit order, so an
//! HTTP resource must commit through the Postgres helper (the fence layer alone orders
//! admissions, not the handlers' effects: see `palisade_fence::fence`). Rules (c) and (e)
//! cover the holds that `etcd_hold` entries list; a hold granted in revisions a snapshot
//! restore took back is known only from its worker's `granted`, so list etcd's holds
//! before each restore to have them all checked. Rule (f) needs each `etcd_hold` to name
//! its revision space (a history without `space` counts every hold in space 0, where
//! nothing was restored).
//!
//! # Writes without a token, and indeterminate writes
//!
//! A write carrying a token is held to rules (a) and (b). A write without one is
//! *unprotected*: it is outside the token order, and the audit trail must record it (the
//! workload sends tokenless writes to advisory resources only; a fenced resource refuses
//! them). An indeterminate write may or may not have committed: it is left out of (a) and
//! (b) (its `seq` is unknown), which cannot hide a violation among the writes that are
//! known to have committed; when a resource reports a mark raised by such a write in a
//! refusal, that mark counts for (b) from then on. For the audit, an indeterminate tokenless
//! write may have one row or none.
//!
//! # Memory and speed
//!
//! The checker reads each entry once. Its memory grows with resources, locks and
//! concurrent operations, not with the number of writes: per resource, its mark and a window
//! of recent commits (folded once no later commit can precede them); per worker, its
//! operations in flight. Three things grow with the run instead, because the after-run
//! listings they join can come in any order: the hold intervals of etcd's history (32
//! bytes a hold), the audit join (a tally per hold and per grant, the lock rows until the
//! end), and the tokens granted and written (8 to 16 bytes a grant). A history of a million entries checks in
//! seconds; the `check` benchmark of this crate measures it.
//!
//! [`check_reader`] sorts entries by `at_ns` within a window ([`REORDER_WINDOW`]), so
//! entries written a little out of time order by concurrent writers are fine; an entry
//! older than the window is reported as [`Violation::OutOfOrder`].
//!
//! # Examples
//!
//! ```
//! use palisade_chaos::check::check;
//! use palisade_chaos::history::{Entry, Event, Target, WriteOutcome};
//!
//! let write = |at_ns, event| Entry { at_ns, worker: 0, event };
//! let history = [
//!     write(1, Event::WriteInvoked { resource: "/legacy/1".into(), target: Target::Http, token: None, op: 1 }),
//!     write(2, Event::WriteCompleted {
//!         resource: "/legacy/1".into(),
//!         target: Target::Http,
//!         token: None,
//!         op: 1,
//!         outcome: WriteOutcome::Committed { seq: 1 },
//!     }),
//! ];
//! let report = check(&history);
//! // The unprotected write has no audit row.
//! assert_eq!(report.violations.len(), 1);
//! println!("{report}");
//! ```

mod audit;
mod floor;
mod force;
mod grants;
mod holds;
mod loss_signal;
mod refs;
mod releases;
mod reorder;
mod report;
mod restored;
mod tiers;
mod untold;
mod violation;
mod violation_text;
mod writes;

use std::io::BufRead;
use std::time::Duration;

use crate::history::{entries, Entry, Event, FaultKind, HoldEnd, Phase, ReadError};

/// The `worker` of entries the runner and the nemesis record.
const RUNNER: u32 = u32::MAX;

pub use loss_signal::LOSS_SIGNAL_SLACK;
pub use report::{CheckReport, Counts};
pub use violation::{
    AuditRecord, EntryIndex, EntryProblem, EpochRef, GrantRef, HoldRef, LockRecordKind, Mark,
    ResourceId, Violation, ViolationKind, WriteRef,
};

/// How far out of `at_ns` order [`check_reader`] accepts entries: 10 s.
pub const REORDER_WINDOW: Duration = Duration::from_secs(10);

/// Checks a history held in memory.
///
/// Entries may come in any order: they are checked in `at_ns` order (ties in slice order).
/// Violations name entries by their index in `entries`.
pub fn check(entries: &[Entry]) -> CheckReport {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| entries[i].at_ns);
    let mut checker = Checker::new();
    for i in order {
        checker.push(EntryIndex(i), &entries[i]);
    }
    checker.finish()
}

/// Checks a JSON-lines history as it streams in, with the [`REORDER_WINDOW`].
///
/// # Errors
///
/// [`ReadError`] if the input cannot be read or a line is not an [`Entry`]; nothing is
/// reported for a history that cannot be read to its end.
pub fn check_reader(input: impl BufRead) -> Result<CheckReport, ReadError> {
    check_reader_with(input, REORDER_WINDOW)
}

/// [`check_reader`] with another reorder window.
///
/// # Errors
///
/// As [`check_reader`].
pub fn check_reader_with(input: impl BufRead, window: Duration) -> Result<CheckReport, ReadError> {
    let mut checker = Checker::new();
    let mut buffer = reorder::Reorder::new(window);
    for (i, entry) in entries(input).enumerate() {
        buffer.push(EntryIndex(i), entry?, |index, entry| {
            checker.push(index, &entry)
        });
    }
    buffer.drain(|index, entry| checker.push(index, &entry));
    Ok(checker.finish())
}

/// The checking engine: feed it entries in `at_ns` order with [`push`](Checker::push), then
/// take the report with [`finish`](Checker::finish).
///
/// An entry recorded earlier than one already pushed is checked anyway and reported as
/// [`Violation::OutOfOrder`].
#[derive(Debug)]
pub struct Checker {
    last_at: u64,
    counts: Counts,
    violations: Vec<Violation>,
    writes: writes::Writes,
    grants: grants::Grants,
    holds: holds::Holds,
    restored: restored::Restored,
    audit: audit::Audit,
    forces: force::Forces,
    releases: releases::Releases,
    loss_signal: loss_signal::LossSignal,
    tiers: tiers::Tiers,
    untold: untold::Untold,
}

impl Default for Checker {
    fn default() -> Self {
        Checker::new()
    }
}

impl Checker {
    /// A checker that has seen nothing.
    pub fn new() -> Self {
        Checker {
            last_at: 0,
            counts: Counts::default(),
            violations: Vec::new(),
            writes: writes::Writes::default(),
            grants: grants::Grants::new(),
            holds: holds::Holds::default(),
            restored: restored::Restored::default(),
            audit: audit::Audit::default(),
            forces: force::Forces::default(),
            releases: releases::Releases::default(),
            loss_signal: loss_signal::LossSignal::default(),
            tiers: tiers::Tiers::default(),
            untold: untold::Untold::default(),
        }
    }

    /// Checks the next entry; `index` is how violations will name it.
    pub fn push(&mut self, index: EntryIndex, entry: &Entry) {
        let (at, worker, out) = (entry.at_ns, entry.worker, &mut self.violations);
        if at < self.last_at {
            out.push(Violation::OutOfOrder {
                entry: index,
                at_ns: at,
                after_ns: self.last_at,
            });
        }
        self.last_at = self.last_at.max(at);
        let c = &mut self.counts;
        c.entries += 1;
        if worker != RUNNER {
            self.loss_signal.entry(index, at, worker, out);
        }
        match &entry.event {
            Event::AcquireInvoked { lock } => {
                c.acquires += 1;
                self.loss_signal.moved_on(worker);
                self.grants.acquire(index, at, worker, lock);
            }
            Event::Granted {
                lock,
                token,
                session,
                grant_rev,
                tier,
            } => {
                c.grants += 1;
                self.forces.granted(index, worker, lock, *token);
                self.restored.handed_out(lock, *session, *token);
                let tier = tier.as_deref();
                self.grants
                    .granted(index, at, worker, lock, *token, *grant_rev, tier, out);
                self.audit.worker_grant(lock, *token, *grant_rev);
                self.loss_signal
                    .granted(index, at, worker, lock, *token, *session);
                self.untold
                    .granted(index, worker, lock, *token, *session, tier);
            }
            Event::SessionRace { .. } => c.session_races += 1,
            Event::AcquireFailed { lock, error: _ } => {
                c.acquire_failures += 1;
                self.grants.failed(worker, lock);
            }
            Event::WriteInvoked {
                resource,
                target,
                token,
                op,
            } => {
                c.writes += 1;
                self.loss_signal.write_invoked(index, worker, *token, out);
                self.writes
                    .invoke(index, at, resource, *target, *token, *op, out);
            }
            Event::WriteCompleted {
                resource,
                target,
                token,
                op,
                outcome,
            } => {
                let completion = writes::Completion {
                    index,
                    at_ns: at,
                    worker,
                    resource,
                    target: *target,
                    token: *token,
                    op: *op,
                    outcome,
                };
                self.writes.complete(completion, c, out);
                if token.is_none() {
                    match outcome {
                        crate::history::WriteOutcome::Committed { .. } => {
                            self.audit.unprotected_write(index, resource, true);
                        }
                        crate::history::WriteOutcome::Indeterminate { .. } => {
                            self.audit.unprotected_write(index, resource, false);
                        }
                        crate::history::WriteOutcome::Rejected { .. } => {}
                    }
                }
            }
            Event::Released { lock, token, .. } => {
                c.releases += 1;
                self.loss_signal.ended(index, worker, *token, false);
                self.forces.released(index, at, worker, *token);
                self.releases.released(index, lock, *token, false);
                self.untold.let_go(worker, *token);
            }
            Event::ReleaseUnknown { lock, token } => {
                c.release_unknowns += 1;
                self.loss_signal.ended(index, worker, *token, false);
                self.releases.released(index, lock, *token, true);
                self.untold.let_go(worker, *token);
            }
            Event::Abandoned { lock: _, token } => {
                self.loss_signal.ended(index, worker, *token, false);
                self.untold.let_go(worker, *token);
            }
            Event::Renewed {
                session,
                sent_ns,
                ttl_ms,
            } => {
                c.renewals += 1;
                self.loss_signal
                    .renewed(worker, *session, *sent_ns, *ttl_ms);
            }
            Event::Lost {
                lock: _,
                token,
                reason,
            } => {
                c.losses += 1;
                self.loss_signal.ended(index, worker, *token, true);
                self.forces.lost(index, worker, *token, reason.as_ref());
                self.untold.lost(index, worker, *token, reason.as_ref());
            }
            Event::ForceRequested {
                lock,
                request_id,
                targets,
            } => {
                c.force_requests += 1;
                self.forces.requested(index, lock, request_id, targets);
            }
            Event::ForceApproved {
                lock,
                request_id,
                outcome,
            } => self.forces.approved(index, at, lock, request_id, outcome),
            Event::EtcdForced {
                lock,
                epoch,
                grant_rev,
                end_rev: _,
                space: _,
                request_id,
            } => self
                .forces
                .etcd_forced(index, lock, *epoch, *grant_rev, request_id),
            Event::Fault {
                kind,
                phase,
                detail: _,
                paused_worker: target,
            } => {
                if *phase == Phase::Start {
                    *c.faults.entry(*kind).or_insert(0) += 1;
                }
                if let (FaultKind::PauseWorker, Some(w)) = (kind, target) {
                    self.loss_signal.pause(*w, at, *phase == Phase::Start);
                }
            }
            Event::EpochAdvanced { epoch, tier } => {
                c.epoch_advances += 1;
                self.forces.epoch_advanced(at);
                self.grants
                    .epoch_advanced(index, at, *epoch, tier.as_deref(), out);
            }
            Event::Rehome { outcome, .. } => match outcome {
                crate::history::RehomeOutcome::Moved { .. } => c.rehomes_moved += 1,
                crate::history::RehomeOutcome::RolledBack { .. } => c.rehomes_rolled_back += 1,
            },
            Event::RevisionSeen {
                tier,
                space,
                revision,
                asked_ns,
            } => {
                c.revision_marks += 1;
                self.tiers
                    .seen(tier.as_deref(), *space, *revision, *asked_ns, at);
            }
            Event::EtcdHold {
                lock,
                epoch,
                grant_rev,
                end_rev,
                exclusive,
                end,
                space,
                session,
                tier,
            } => {
                c.etcd_holds += 1;
                let tier = tier.as_deref();
                if *exclusive {
                    c.exclusive_holds += 1;
                }
                let ended = *end != HoldEnd::Open;
                if ended != end_rev.is_some() {
                    let problem = EntryProblem::HoldEndMismatch {
                        end: *end,
                        end_rev: *end_rev,
                    };
                    out.push(Violation::MalformedEntry {
                        entry: index,
                        problem,
                    });
                }
                if !(0..1 << 48).contains(grant_rev) {
                    let problem = EntryProblem::RevisionOutOfRange(*grant_rev);
                    out.push(Violation::MalformedEntry {
                        entry: index,
                        problem,
                    });
                    return;
                }
                if end_rev.is_some_and(|e| e <= *grant_rev) {
                    out.push(Violation::MalformedEntry {
                        entry: index,
                        problem: EntryProblem::HoldEndsBeforeGrant,
                    });
                }
                let token = (u64::from(*epoch) << 48) | *grant_rev as u64;
                let hold = HoldRef {
                    entry: index,
                    grant_rev: *grant_rev,
                    end_rev: *end_rev,
                    exclusive: *exclusive,
                };
                self.restored
                    .granted(lock, *space, *epoch, *session, hold.clone());
                self.releases.etcd_hold(
                    index,
                    lock,
                    token,
                    *session,
                    (tier, *space),
                    *grant_rev,
                    *end_rev,
                    *end,
                );
                self.tiers.hold(lock, tier, *space, token, hold.clone());
                if *end == HoldEnd::Released {
                    self.untold
                        .released(lock, token, *session, tier, hold.clone());
                }
                self.holds.add(lock, *epoch, tier, *space, hold);
                self.grants.etcd_token(token);
                let home = tier.is_none();
                self.audit.etcd_hold(
                    index,
                    lock,
                    token,
                    *grant_rev,
                    *end_rev,
                    *end,
                    (home, *space),
                );
            }
            Event::RestoredHold {
                lock,
                epoch,
                grant_rev,
                restored_rev,
                space,
                end_rev,
                exclusive,
                end,
            } => {
                c.restored_holds += 1;
                self.releases.space(None, *space);
                let ended = *end != HoldEnd::Open;
                if ended != end_rev.is_some() {
                    let problem = EntryProblem::HoldEndMismatch {
                        end: *end,
                        end_rev: *end_rev,
                    };
                    out.push(Violation::MalformedEntry {
                        entry: index,
                        problem,
                    });
                }
                for rev in [*grant_rev, *restored_rev] {
                    if !(0..1 << 48).contains(&rev) {
                        let problem = EntryProblem::RevisionOutOfRange(rev);
                        out.push(Violation::MalformedEntry {
                            entry: index,
                            problem,
                        });
                        return;
                    }
                }
                if grant_rev > restored_rev {
                    out.push(Violation::MalformedEntry {
                        entry: index,
                        problem: EntryProblem::RestoredAfterSnapshot,
                    });
                }
                if end_rev.is_some_and(|e| e <= *restored_rev) {
                    out.push(Violation::MalformedEntry {
                        entry: index,
                        problem: EntryProblem::HoldEndsBeforeRestore,
                    });
                }
                let hold = HoldRef {
                    entry: index,
                    grant_rev: *grant_rev,
                    end_rev: *end_rev,
                    exclusive: *exclusive,
                };
                self.restored
                    .restored(lock, *space, *epoch, *restored_rev, hold);
                self.grants
                    .etcd_token((u64::from(*epoch) << 48) | *grant_rev as u64);
            }
            Event::AuditCut { space, through } => self.audit.cut(*space, *through),
            Event::AuditRow {
                kind,
                lock,
                resource,
                token,
                revision,
            } => {
                c.audit_rows += 1;
                self.audit.row(
                    index,
                    kind,
                    lock.as_ref(),
                    resource.as_deref(),
                    *token,
                    *revision,
                    out,
                );
            }
        }
    }

    /// Runs the checks that need the whole history and returns the report.
    pub fn finish(mut self) -> CheckReport {
        let out = &mut self.violations;
        self.holds.finish(out);
        self.restored.finish(out);
        self.tiers.finish(out);
        self.counts.forced_holds = self.forces.forced_count();
        self.forces.finish(out);
        self.releases.finish(out);
        self.untold.finish(out);
        let mut unknown: Vec<_> = self
            .writes
            .tokens()
            .filter(|(t, _)| !self.grants.was_granted(*t))
            .collect();
        unknown.sort_by_key(|(_, i)| *i);
        out.extend(
            unknown
                .into_iter()
                .map(|(token, write)| Violation::UnknownToken { write, token }),
        );
        self.counts.audit_lost_with_cluster = self.audit.finish(out);
        CheckReport {
            counts: self.counts,
            violations: self.violations,
        }
    }
}
