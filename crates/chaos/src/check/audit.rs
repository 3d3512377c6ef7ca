//! Check (e): the audit rows match the history, each event exactly once.
//!
//! What must be recorded, and how often:
//! - every hold etcd's history shows (`etcd_hold`): one `grant` row, and one row of its end
//!   (`release`, `expire` or `force`) unless it is still open; a forced one also has one
//!   `force_release` row (the approving replica's record, naming the grant's token and
//!   the force's revision); where an `audit_cut` says
//!   the tailer had read the hold's revision space only through a revision when a restore
//!   destroyed it, an event above that revision may have no row (at most one);
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

/// A hold of etcd's history, kept until every `audit_cut` is known.
#[derive(Debug)]
struct EtcdHold {
    entry: EntryIndex,
    lock: LockName,
    token: u64,
    grant_rev: i64,
    end_rev: Option<i64>,
    end: HoldEnd,
    space: u32,
    /// Of the home tier (the only one a restore cuts).
    home: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Audit {
    tallies: HashMap<AuditRecord, Tally>,
    /// The holds of etcd's history, turned into tallies at the end.
    pending: Vec<EtcdHold>,
    /// Per revision space a restore destroyed: the last revision the tailer stored.
    cuts: HashMap<u32, i64>,
    /// Holds etcd's history shows: `(lock, token)` -> `(grant_rev, end_rev)`.
    etcd_holds: HashMap<(LockName, u64), (i64, Option<i64>)>,
    /// Holds workers saw: `(lock, grant_rev)` -> token.
    worker_holds: HashMap<(LockName, i64), u64>,
    lock_rows: Vec<LockRow>,
}

impl Audit {
    /// A hold from etcd's history, granted in revision space `space`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn etcd_hold(
        &mut self,
        entry: EntryIndex,
        lock: &LockName,
        token: u64,
        grant_rev: i64,
        end_rev: Option<i64>,
        end: HoldEnd,
        (home, space): (bool, u32),
    ) {
        self.pending.push(EtcdHold {
            entry,
            lock: lock.clone(),
            token,
            grant_rev,
            end_rev,
            end,
            space,
            home,
        });
        self.etcd_holds
            .insert((lock.clone(), token), (grant_rev, end_rev));
    }

    /// An `audit_cut`: the tailer had stored `space` through `through` when it was
    /// destroyed. The lowest wins if a space is cut twice.
    pub(crate) fn cut(&mut self, space: u32, through: i64) {
        let at = self.cuts.entry(space).or_insert(through);
        *at = (*at).min(through);
    }

    /// Turns the holds of etcd's history into tallies: one row of each event, or at most
    /// one for an event above its space's cut.
    fn expect_holds(&mut self) {
        for h in std::mem::take(&mut self.pending) {
            let cut = if h.home {
                self.cuts.get(&h.space).copied().unwrap_or(i64::MAX)
            } else {
                i64::MAX
            };
            let needed = |rev: i64| usize::from(rev <= cut);
            let record = |kind| AuditRecord::Lock {
                kind,
                lock: h.lock.clone(),
                token: h.token,
            };
            self.tallies
                .entry(record(LockRecordKind::Grant))
                .or_default()
                .expect(h.entry, needed(h.grant_rev), 1);
            if let (Some(kind), Some(end_rev)) = (LockRecordKind::of_end(h.end), h.end_rev) {
                self.tallies
                    .entry(record(kind))
                    .or_default()
                    .expect(h.entry, needed(end_rev), 1);
            }
            if h.end == HoldEnd::Forced {
                // Written by the approving replica, not the tailer: no cut applies.
                self.tallies
                    .entry(record(LockRecordKind::ForceRecord))
                    .or_default()
                    .expect(h.entry, 1, 1);
            }
        }
    }

    /// A grant a worker saw.
    pub(crate) fn worker_grant(&mut self, lock: &LockName, token: u64, grant_rev: i64) {
        self.worker_holds.insert((lock.clone(), grant_rev), token);
    }

    /// A completed write without a token: `committed` or indeterminate.
    pub(crate) fn unprotected_write(&mut self, entry: EntryIndex, resource: &str, committed: bool) {
        let record = AuditRecord::UnprotectedWrite {
            resource: resource.to_owned(),
        };
        self.tallies
            .entry(record)
            .or_default()
            .expect(entry, usize::from(committed), 1);
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
            "force_release" => LockRecordKind::ForceRecord,
            "unprotected_write" => {
                match resource {
                    Some(resource) => {
                        let record = AuditRecord::UnprotectedWrite {
                            resource: resource.to_owned(),
                        };
                        self.tallies.entry(record).or_default().rows.push(entry);
                    }
                    None => out.push(Violation::MalformedEntry {
                        entry,
                        problem: EntryProblem::AuditRowWithoutResource,
                    }),
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
                self.lock_rows.push(LockRow {
                    entry,
                    kind,
                    lock: lock.clone(),
                    token,
                    revision,
                });
            }
            _ => out.push(Violation::MalformedEntry {
                entry,
                problem: EntryProblem::AuditRowWithoutLock,
            }),
        }
    }

    /// Checks every row and tally; returns how many events above a cut have no row.
    pub(crate) fn finish(mut self, out: &mut Vec<Violation>) -> u64 {
        self.expect_holds();
        let mut lost = 0;
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
        let worker_tokens: HashSet<(&LockName, u64)> = self
            .worker_holds
            .iter()
            .map(|((l, _), t)| (l, *t))
            .collect();
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
                found.push(Violation::AuditUnexpected {
                    row: row.entry,
                    record: None,
                });
                continue;
            };
            let record = AuditRecord::Lock {
                kind: row.kind,
                lock: row.lock.clone(),
                token,
            };
            let contradicts = match (
                row.kind,
                row.revision,
                self.etcd_holds.get(&(row.lock.clone(), token)),
            ) {
                (_, None, _) => false,
                (LockRecordKind::Grant, Some(rev), _) => {
                    u64::try_from(rev).ok() != Some(token & REVISION_MASK)
                }
                (_, Some(rev), Some((_, end_rev))) => *end_rev != Some(rev),
                (_, Some(_), None) => false,
            };
            if contradicts {
                found.push(Violation::AuditUnexpected {
                    row: row.entry,
                    record: Some(record),
                });
                continue;
            }
            let seen_by_worker_only = worker_tokens.contains(&(&row.lock, token))
                && !self.etcd_holds.contains_key(&(row.lock.clone(), token));
            match self.tallies.get_mut(&record) {
                Some(tally) => tally.rows.push(row.entry),
                None if seen_by_worker_only => extra.push((record, row.entry)),
                None => found.push(Violation::AuditUnexpected {
                    row: row.entry,
                    record: Some(record),
                }),
            }
        }
        for (record, entry) in extra {
            let tally = self.tallies.entry(record).or_insert_with(|| Tally {
                allowed: 1,
                ..Tally::default()
            });
            tally.rows.push(entry);
        }
        for (record, tally) in self.tallies {
            if tally.rows.is_empty()
                && tally.expected == 0
                && matches!(record, AuditRecord::Lock { .. })
            {
                lost += 1;
            }
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
                        found.push(Violation::AuditUnexpected {
                            row,
                            record: Some(record.clone()),
                        });
                    }
                } else {
                    found.push(Violation::AuditDuplicate {
                        record,
                        allowed: tally.allowed,
                        rows: tally.rows,
                    });
                }
            }
        }
        found.sort_by_key(|v| v.entries().into_iter().min());
        out.extend(found);
        lost
    }
}
