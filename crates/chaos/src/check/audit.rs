//! Check (e): the audit rows match the history, each event exactly once.
//!
//! What must be recorded, and how often:
//! - every hold etcd's history shows (`etcd_hold`): one `grant` row, and one row of its end
//!   (`release`, `expire` or `force`) unless it is still open;
//! - a hold only a worker saw (`granted`, absent from etcd's history, for example granted in
//!   revisions a snapshot restore took back): at most one row of each kind, since the audit
//!   trail may or may not have seen it;
//! - writes without a token: per resource, at least one `unprotected_write` row per
//!   committed write and at most one per committed or indeterminate write (an indeterminate
//!   write may or may not have reached the resource).
//!
//! Lock rows are matched by `(kind, lock, token)`; a row without a token by its revision
//! (the hold's grant revision, or the revision that ended it). A row whose revision
//! contradicts the hold it names counts as unexpected. Memory: one tally per hold and per
//! resource written without a token, and the lock rows until the end.

use std::collections::{HashMap, HashSet};

use super::violation::{AuditRecord, EntryIndex, EntryProblem, LockRecordKind, Violation};
use crate::history::{HoldEnd, LockName};

const REVISION_MASK: u64 = (1 << 48) - 1;

#[derive(Debug, Default)]
struct Tally {
    /// Rows needed at least.
    expected: usize,
    /// Rows allowed at most.
    allowed: usize,
    /// The first entry that shows the event happened.
    evidence: Option<EntryIndex>,
    rows: Vec<EntryIndex>,
}

impl Tally {
    fn expect(&mut self, evidence: EntryIndex, expected: usize, allowed: usize) {
        self.expected += expected;
        self.allowed += allowed;
        self.evidence.get_or_insert(evidence);
    }
}

/// A lock row, kept until every hold is known.
#[derive(Debug)]
struct LockRow {
    entry: EntryIndex,
    kind: LockRecordKind,
    lock: LockName,
    token: Option<u64>,
    revision: Option<i64>,
}

#[derive(Debug, Default)]
pub(crate) struct Audit {
    tallies: HashMap<AuditRecord, Tally>,
    /// Holds etcd's history shows: `(lock, token)` -> `(grant_rev, end_rev)`.
    etcd_holds: HashMap<(LockName, u64), (i64, Option<i64>)>,
    /// Holds workers saw: `(lock, grant_rev)` -> token.
    worker_holds: HashMap<(LockName, i64), u64>,
    lock_rows: Vec<LockRow>,
}

impl Audit {
    /// A hold from etcd's history.
    pub(crate) fn etcd_hold(
        &mut self,
        entry: EntryIndex,
        lock: &LockName,
        token: u64,
        grant_rev: i64,
        end_rev: Option<i64>,
        end: HoldEnd,
    ) {
        let record = |kind| AuditRecord::Lock { kind, lock: lock.clone(), token };
        self.tallies.entry(record(LockRecordKind::Grant)).or_default().expect(entry, 1, 1);
        if let Some(kind) = LockRecordKind::of_end(end) {
            self.tallies.entry(record(kind)).or_default().expect(entry, 1, 1);
        }
        self.etcd_holds.insert((lock.clone(), token), (grant_rev, end_rev));
    }

    /// A grant a worker saw.
    pub(crate) fn worker_grant(&mut self, lock: &LockName, token: u64, grant_rev: i64) {
        self.worker_holds.insert((lock.clone(), grant_rev), token);
    }

    /// A completed write without a token: `committed` or indeterminate.
    pub(crate) fn unprotected_write(&mut self, entry: EntryIndex, resource: &str, committed: bool) {
        let record = AuditRecord::UnprotectedWrite { resource: resource.to_owned() };
        self.tallies.entry(record).or_default().expect(entry, usize::from(committed), 1);
    }

    /// An `audit_row` entry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row(
        &mut self,
        entry: EntryIndex,
        kind: &str,
        lock: Option<&LockName>,
        resource: Option<&str>,
        token: Option<u64>,
        revision: Option<i64>,
        out: &mut Vec<Violation>,
    ) {
        let kind = match kind {
            "grant" => LockRecordKind::Grant,
            "release" => LockRecordKind::Release,
            "expire" => LockRecordKind::Expire,
            "force" => LockRecordKind::Force,
            "unprotected_write" => {
                match resource {
                    Some(resource) => {
                        let record = AuditRecord::UnprotectedWrite { resource: resource.to_owned() };
                        self.tallies.entry(record).or_default().rows.push(entry);
                    }
                    None => out.push(Violation::MalformedEntry { entry, problem: EntryProblem::AuditRowWithoutResource }),
                }
                return;
            }
            other => {
                let problem = EntryProblem::UnknownAuditKind(other.to_owned());
                out.push(Violation::MalformedEntry { entry, problem });
                return;
            }
        };
        match lock {
            Some(lock) if token.is_some() || revision.is_some() => {
                self.lock_rows.push(LockRow { entry, kind, lock: lock.clone(), token, revision });
            }
            _ => out.push(Violation::MalformedEntry { entry, problem: EntryProblem::AuditRowWithoutLock }),
        }
    }

    pub(crate) fn finish(mut self, out: &mut Vec<Violation>) {
        let mut found = Vec::new();
        // Rows without a token name a revision: the grant's or the end's.
        let mut by_grant_rev: HashMap<(&LockName, i64), u64> = HashMap::new();
        let mut by_end_rev: HashMap<(&LockName, i64), u64> = HashMap::new();
        for ((lock, token), (grant_rev, end_rev)) in &self.etcd_holds {
            by_grant_rev.insert((lock, *grant_rev), *token);
            if let Some(end) = end_rev {
                by_end_rev.insert((lock, *end), *token);
            }
        }
        for ((lock, grant_rev), token) in &self.worker_holds {
            by_grant_rev.entry((lock, *grant_rev)).or_insert(*token);
        }
        let worker_tokens: HashSet<(&LockName, u64)> = self.worker_holds.iter().map(|((l, _), t)| (l, *t)).collect();
        let mut extra: Vec<(AuditRecord, EntryIndex)> = Vec::new();
        for row in &self.lock_rows {
            let token = row.token.or_else(|| {
                let rev = row.revision?;
                match row.kind {
                    LockRecordKind::Grant => by_grant_rev.get(&(&row.lock, rev)).copied(),
                    _ => by_end_rev.get(&(&row.lock, rev)).copied(),
                }
            });
            let Some(token) = token else {
                found.push(Violation::AuditUnexpected { row: row.entry, record: None });
                continue;
            };
            let record = AuditRecord::Lock { kind: row.kind, lock: row.lock.clone(), token };
            let contradicts = match (row.kind, row.revision, self.etcd_holds.get(&(row.lock.clone(), token))) {
                (_, None, _) => false,
                (LockRecordKind::Grant, Some(rev), _) => u64::try_from(rev).ok() != Some(token & REVISION_MASK),
                (_, Some(rev), Some((_, end_rev))) => *end_rev != Some(rev),
                (_, Some(_), None) => false,
            };
            if contradicts {
                found.push(Violation::AuditUnexpected { row: row.entry, record: Some(record) });
                continue;
            }
            let seen_by_worker_only = worker_tokens.contains(&(&row.lock, token))
                && !self.etcd_holds.contains_key(&(row.lock.clone(), token));
            match self.tallies.get_mut(&record) {
                Some(tally) => tally.rows.push(row.entry),
                None if seen_by_worker_only => extra.push((record, row.entry)),
                None => found.push(Violation::AuditUnexpected { row: row.entry, record: Some(record) }),
            }
        }
        for (record, entry) in extra {
            let tally = self.tallies.entry(record).or_insert_with(|| Tally { allowed: 1, ..Tally::default() });
            tally.rows.push(entry);
        }
        for (record, tally) in self.tallies {
            if tally.rows.len() < tally.expected {
                found.push(Violation::AuditMissing {
                    evidence: tally.evidence.expect("an expected record has its evidence"),
                    expected: tally.expected,
                    rows: tally.rows,
                    record,
                });
            } else if tally.rows.len() > tally.allowed {
                if tally.allowed == 0 {
                    for row in tally.rows {
                        found.push(Violation::AuditUnexpected { row, record: Some(record.clone()) });
                    }
                } else {
                    found.push(Violation::AuditDuplicate { record, allowed: tally.allowed, rows: tally.rows });
                }
            }
        }
        found.sort_by_key(|v| v.entries().into_iter().min());
        out.extend(found);
    }
}
