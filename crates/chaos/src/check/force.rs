//! Check (g): a force release ends only the holds its request named, its approval's
//! answer is true, and the holder is told.
//!
//! A request's targets are fixed when it is made (`force_requested`, the grant revisions
//! the service answered with); etcd's history shows each hold a force ended, with the
//! request its marker names (`etcd_forced`). Every forced hold must be among the targets
//! of that request, so a hold granted after the request (the holder released and
//! acquired again before the approval) is never forced. An approval that answered
//! `released` must have ended each hold it lists, and one that answered
//! `force-target-gone` none. A worker handed a forced hold must record its loss
//! (`lost`: the keepalive told it, naming this request, or its session ended, or a
//! release was refused), and no successful release of it after the approval answered
//! with no epoch advance in between (before the answer, the two are concurrent: the
//! release may have come first; after a snapshot restore the hold may be back and be
//! released in the new space).
//!
//! Memory: per grant a worker saw, its lock and token; per loss and release, a key; per
//! request, approval and forced hold, one record. The rules join them at the end.

use std::collections::HashMap;

use super::violation::{EntryIndex, Violation};
use crate::history::{ForceOutcome, LockName, LossReason};

#[derive(Debug)]
struct Request {
    entry: EntryIndex,
    lock: LockName,
    targets: Vec<i64>,
}

#[derive(Debug)]
struct Approval {
    entry: EntryIndex,
    at_ns: u64,
    lock: LockName,
    request_id: String,
    outcome: ForceOutcome,
}

#[derive(Debug)]
struct Forced {
    entry: EntryIndex,
    lock: LockName,
    token: u64,
    grant_rev: i64,
    request_id: String,
}

/// A `lost` entry and what it said.
type Told = (EntryIndex, Option<LossReason>);

#[derive(Debug, Default)]
pub(crate) struct Forces {
    requests: HashMap<String, Request>,
    approvals: Vec<Approval>,
    forced: Vec<Forced>,
    /// `(lock, token)` -> the `granted` entry and its worker.
    grants: HashMap<(LockName, u64), (EntryIndex, u32)>,
    /// `(worker, token)` -> the `lost` entries and what they said.
    losses: HashMap<(u32, u64), Vec<Told>>,
    /// When epochs were advanced (after each snapshot restore).
    advances: Vec<u64>,
    /// `(worker, token)` -> its `released` entries and their `at_ns`.
    released: HashMap<(u32, u64), Vec<(EntryIndex, u64)>>,
}

impl Forces {
    pub(crate) fn granted(&mut self, entry: EntryIndex, worker: u32, lock: &LockName, token: u64) {
        self.grants
            .entry((lock.clone(), token))
            .or_insert((entry, worker));
    }

    pub(crate) fn lost(
        &mut self,
        entry: EntryIndex,
        worker: u32,
        token: u64,
        reason: Option<&LossReason>,
    ) {
        self.losses
            .entry((worker, token))
            .or_default()
            .push((entry, reason.cloned()));
    }

    pub(crate) fn released(&mut self, entry: EntryIndex, at_ns: u64, worker: u32, token: u64) {
        self.released
            .entry((worker, token))
            .or_default()
            .push((entry, at_ns));
    }

    /// An epoch advance at `at_ns`: a restore may have brought forced holds back.
    pub(crate) fn epoch_advanced(&mut self, at_ns: u64) {
        self.advances.push(at_ns);
    }

    pub(crate) fn requested(
        &mut self,
        entry: EntryIndex,
        lock: &LockName,
        request_id: &str,
        targets: &[i64],
    ) {
        self.requests.insert(
            request_id.to_owned(),
            Request {
                entry,
                lock: lock.clone(),
                targets: targets.to_vec(),
            },
        );
    }

    pub(crate) fn approved(
        &mut self,
        entry: EntryIndex,
        at_ns: u64,
        lock: &LockName,
        request_id: &str,
        outcome: &ForceOutcome,
    ) {
        self.approvals.push(Approval {
            entry,
            at_ns,
            lock: lock.clone(),
            request_id: request_id.to_owned(),
            outcome: outcome.clone(),
        });
    }

    pub(crate) fn etcd_forced(
        &mut self,
        entry: EntryIndex,
        lock: &LockName,
        epoch: u16,
        grant_rev: i64,
        request_id: &str,
    ) {
        self.forced.push(Forced {
            entry,
            lock: lock.clone(),
            token: (u64::from(epoch) << 48) | (grant_rev as u64 & ((1 << 48) - 1)),
            grant_rev,
            request_id: request_id.to_owned(),
        });
    }

    /// How many holds etcd's history shows forced.
    pub(crate) fn forced_count(&self) -> u64 {
        self.forced.len() as u64
    }

    pub(crate) fn finish(self, out: &mut Vec<Violation>) {
        for f in &self.forced {
            let request = self.requests.get(&f.request_id);
            let named =
                request.is_some_and(|r| r.lock == f.lock && r.targets.contains(&f.grant_rev));
            if !named {
                out.push(Violation::ForcedOutsideTargets {
                    lock: f.lock.clone(),
                    forced: f.entry,
                    grant_rev: f.grant_rev,
                    request_id: f.request_id.clone(),
                    request: request.map(|r| r.entry),
                });
            }
            let Some(&(grant, worker)) = self.grants.get(&(f.lock.clone(), f.token)) else {
                continue;
            };
            let losses = self
                .losses
                .get(&(worker, f.token))
                .map_or(&[][..], Vec::as_slice);
            let fits = |reason: &Option<LossReason>| match reason {
                Some(LossReason::Forced {
                    request_id: Some(r),
                }) => *r == f.request_id,
                _ => true,
            };
            // A release the worker saw succeed after the approval that forced the hold
            // had answered: the release came after the force, and cannot have ended it.
            let approved_at = self
                .approvals
                .iter()
                .filter(|a| a.request_id == f.request_id)
                .map(|a| a.at_ns)
                .min();
            let released_after = self
                .released
                .get(&(worker, f.token))
                .into_iter()
                .flatten()
                .find(|(_, at)| {
                    approved_at.is_some_and(|a| {
                        *at > a && !self.advances.iter().any(|e| (a..*at).contains(e))
                    })
                })
                .map(|(e, _)| *e);
            let told = losses.iter().any(|(_, reason)| fits(reason));
            if !told || released_after.is_some() {
                let other = losses.iter().find(|(_, r)| !fits(r)).map(|(e, _)| *e);
                out.push(Violation::ForcedHoldNotTold {
                    lock: f.lock.clone(),
                    forced: f.entry,
                    grant,
                    worker,
                    told_wrong: released_after.or(other),
                });
            }
        }
        for a in &self.approvals {
            let mut of_request = self
                .forced
                .iter()
                .filter(|f| f.request_id == a.request_id && f.lock == a.lock);
            match &a.outcome {
                ForceOutcome::Released { grant_revs } => {
                    for rev in grant_revs {
                        if !of_request.clone().any(|f| f.grant_rev == *rev) {
                            out.push(Violation::ForceAnswerFalse {
                                lock: a.lock.clone(),
                                approval: a.entry,
                                request_id: a.request_id.clone(),
                                grant_rev: Some(*rev),
                                forced: None,
                            });
                        }
                    }
                }
                ForceOutcome::TargetGone => {
                    if let Some(f) = of_request.next() {
                        out.push(Violation::ForceAnswerFalse {
                            lock: a.lock.clone(),
                            approval: a.entry,
                            request_id: a.request_id.clone(),
                            grant_rev: None,
                            forced: Some(f.entry),
                        });
                    }
                }
                ForceOutcome::Unknown { .. } => {}
            }
        }
    }
}
