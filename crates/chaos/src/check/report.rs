//! The checker's answer: counts and every violation.

use std::collections::BTreeMap;
use std::fmt;

use super::violation::{Violation, ViolationKind};
use crate::history::FaultKind;

/// What the history contains, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Entries read.
    pub entries: u64,
    /// `acquire_invoked` entries.
    pub acquires: u64,
    /// `granted` entries: holds workers were handed.
    pub grants: u64,
    /// `acquire_failed` entries.
    pub acquire_failures: u64,
    /// `released` entries.
    pub releases: u64,
    /// `lost` entries: holds whose loss a worker was told of.
    pub losses: u64,
    /// `renewed` entries: session renewals (and opens) a worker's client had
    /// acknowledged.
    pub renewals: u64,
    /// `release_unknown` entries: releases whose outcome the worker's client did not learn
    /// within its budget.
    pub release_unknowns: u64,
    /// `session_race` entries: races a worker ran on its session (a reset acquire sent
    /// again, or two tasks acquiring one lock).
    pub session_races: u64,
    /// `force_requested` entries.
    pub force_requests: u64,
    /// `etcd_forced` entries: holds etcd's history shows force-released.
    pub forced_holds: u64,
    /// `write_invoked` entries.
    pub writes: u64,
    /// Writes the resource committed.
    pub writes_committed: u64,
    /// Writes the resource refused (stale, missing or malformed token).
    pub writes_rejected: u64,
    /// Writes whose outcome the writer does not know.
    pub writes_indeterminate: u64,
    /// Refused writes that carried a token: stale writers stopped.
    pub stale_writes_rejected: u64,
    /// Committed writes without a token.
    pub unprotected_writes: u64,
    /// Faults injected (`fault` entries with phase `start`), by kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// `epoch_advanced` entries.
    pub epoch_advances: u64,
    /// Holds in etcd's history (`etcd_hold` entries).
    pub etcd_holds: u64,
    /// Of them, exclusive.
    pub exclusive_holds: u64,
    /// Holds a snapshot restore brought back (`restored_hold` entries).
    pub restored_holds: u64,
    /// Rehomes that moved the namespace (`rehome` entries, outcome `moved`).
    pub rehomes_moved: u64,
    /// Rehomes rolled back (`rehome` entries, outcome `rolled_back`).
    pub rehomes_rolled_back: u64,
    /// `revision_seen` entries: reads of a tier's revision that place its revisions in
    /// real time.
    pub revision_marks: u64,
    /// `audit_row` entries.
    pub audit_rows: u64,
    /// Lock events above an `audit_cut` (read by no tailer before a restore destroyed
    /// their cluster) that have no audit row.
    pub audit_lost_with_cluster: u64,
}

/// What [`check`](super::check) found: counts, and every violation with its evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckReport {
    /// What the history contains.
    pub counts: Counts,
    /// Every violation found, in the order found (audit violations come last).
    pub violations: Vec<Violation>,
}

impl CheckReport {
    /// `true` when no rule is broken.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many violations of each kind.
    pub fn violations_by_kind(&self) -> BTreeMap<ViolationKind, usize> {
        let mut by_kind = BTreeMap::new();
        for v in &self.violations {
            *by_kind.entry(v.kind()).or_insert(0) += 1;
        }
        by_kind
    }
}

impl fmt::Display for CheckReport {
    /// A summary table, then one line per violation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        let rows: [(&str, u64); 22] = [
            ("entries", c.entries),
            ("acquires", c.acquires),
            ("grants", c.grants),
            ("acquire failures", c.acquire_failures),
            ("releases", c.releases),
            ("releases unknown", c.release_unknowns),
            ("losses", c.losses),
            ("renewals", c.renewals),
            ("force requests", c.force_requests),
            ("  holds forced", c.forced_holds),
            ("writes", c.writes),
            ("  committed", c.writes_committed),
            ("  rejected", c.writes_rejected),
            ("  indeterminate", c.writes_indeterminate),
            ("stale writes rejected", c.stale_writes_rejected),
            ("unprotected writes", c.unprotected_writes),
            ("epoch advances", c.epoch_advances),
            ("etcd holds", c.etcd_holds),
            ("  exclusive", c.exclusive_holds),
            ("restored holds", c.restored_holds),
            ("audit rows", c.audit_rows),
            ("  events lost with a cluster", c.audit_lost_with_cluster),
        ];
        for (name, n) in rows {
            writeln!(f, "{name:<24}{n:>12}")?;
        }
        for (kind, n) in &c.faults {
            writeln!(f, "{:<24}{n:>12}", format!("fault {kind:?}"))?;
        }
        writeln!(f, "{:<24}{:>12}", "violations", self.violations.len())?;
        for (kind, n) in self.violations_by_kind() {
            writeln!(f, "{:<24}{n:>12}", format!("  {kind:?}"))?;
        }
        for v in &self.violations {
            writeln!(f, "- {v}")?;
        }
        Ok(())
    }
}
