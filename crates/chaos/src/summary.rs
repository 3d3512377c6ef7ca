//! The summary of a run, counted from its history: operations, writes by resource kind and
//! outcome, faults by kind, and the checker's verdict.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::history::{
    Entry, Event, FaultKind, ForceOutcome, HoldEnd, LossReason, Phase, RaceKind, RehomeOutcome,
    Target, WriteOutcome,
};
use crate::options::RunOptions;

/// What the run knows that the history does not say.
#[derive(Debug, Default, Clone)]
pub(crate) struct RunTallies {
    pub(crate) audit_replayed: u64,
    pub(crate) unmatched_ends: u64,
    pub(crate) audit_gaps: u64,
    pub(crate) sink_dropped: u64,
    pub(crate) tailer_caught_up: bool,
    /// Workers that exited before the end, as the reader should know them.
    pub(crate) workers_failed: Vec<String>,
    /// The fault kinds the run could inject.
    pub(crate) kinds: Vec<FaultKind>,
    /// The layout, and what it left out (see [`Summary::notes`]).
    pub(crate) notes: Vec<String>,
}

/// Write outcomes of one kind of resource.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteCounts {
    /// Committed by the resource.
    pub committed: u64,
    /// Refused as stale.
    pub rejected: u64,
    /// Outcome unknown to the writer.
    pub indeterminate: u64,
}

/// What a run did, and what the checker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The run's seed.
    pub seed: u64,
    /// How long the run took, from the first to the last entry.
    pub elapsed: Duration,
    /// Worker processes.
    pub workers: u32,
    /// Lock keys.
    pub keys: u32,
    /// Acquire calls.
    pub acquires: u64,
    /// Grants (with a token).
    pub grants: u64,
    /// Acquires that failed or timed out.
    pub acquire_failures: u64,
    /// Holds released by their worker.
    pub releases: u64,
    /// Releases whose outcome the worker's client did not learn in time (it goes on in
    /// the background).
    pub release_unknowns: u64,
    /// Holds whose loss a worker was told of.
    pub losses: u64,
    /// Acquires sent again on their session after their connection was reset (session
    /// races on, see [`RACES_ENV`](crate::RACES_ENV)).
    pub races_reset_retry: u64,
    /// Acquires of one lock by two tasks sharing a session (session races on).
    pub races_shared_session: u64,
    /// Of them, told as force-released.
    pub losses_forced: u64,
    /// Force release requests made.
    pub force_requests: u64,
    /// Approvals answered `force-target-gone` (the holder had released meanwhile).
    pub force_targets_gone: u64,
    /// Holds etcd's history shows force-released.
    pub forced_holds: u64,
    /// Fenced writes straight to Postgres (`fenced_transaction`).
    pub postgres: WriteCounts,
    /// Fenced writes over HTTP (`FenceLayer`).
    pub http: WriteCounts,
    /// Token-less writes to the advisory resource.
    pub advisory: WriteCounts,
    /// Faults injected (started), by kind: every kind the run could inject, 0 for those
    /// it did not.
    pub faults: BTreeMap<FaultKind, u64>,
    /// How the run was laid out (`network: 12 hosts` or loopback) and which fault kinds
    /// it did not plan and why (loopback: the network faults; a kernel without netem:
    /// `netem_latency`).
    pub notes: Vec<String>,
    /// Epoch advances.
    pub epochs_advanced: u64,
    /// Rehomes that moved the namespace to the other tier.
    pub rehomes_moved: u64,
    /// Rehomes the service rolled back (the drain did not finish in time).
    pub rehomes_rolled_back: u64,
    /// Holds read from the spare tier's etcd history (of [`Summary::etcd_holds`]).
    pub spare_tier_holds: u64,
    /// Holds read from etcd's history.
    pub etcd_holds: u64,
    /// Holds a restore brought back (`restored_hold` entries; each is also reported,
    /// with its first end, from the cluster that granted it).
    pub restored_holds: u64,
    /// Of them, those the restored cluster ended again before the history was read.
    pub restored_holds_ended: u64,
    /// Hold keys deleted in a revision space that was read, which neither were created in
    /// it nor were present at its start (0 unless a read missed part of a space).
    pub unmatched_hold_ends: u64,
    /// Rows read from the audit trail.
    pub audit_rows: u64,
    /// Audit rows left out as restored history: copies of the old cluster's, and the
    /// ends of holds a restore brought back.
    pub audit_replayed: u64,
    /// Audit `gap` rows.
    pub audit_gaps: u64,
    /// Lock events that went with a cluster a restore destroyed before the tailer read
    /// them, and have no audit row (the checker's count).
    pub audit_lost_with_cluster: u64,
    /// Write events the resource's audit sink dropped.
    pub audit_dropped: u64,
    /// Whether the audit tailer had stored etcd's history through the end of the run.
    pub tailer_caught_up: bool,
    /// Workers that exited before the run told them to stop (their history is cut short).
    pub workers_failed: Vec<String>,
    /// The checker's violations; `None` when the history was not checked.
    pub violations: Option<Vec<String>>,
    /// Where the history is.
    pub history: PathBuf,
}

impl Summary {
    pub(crate) fn of(options: &RunOptions, entries: &[Entry], extra: RunTallies) -> Summary {
        let mut s = Summary {
            seed: options.seed,
            elapsed: Duration::from_nanos(entries.iter().map(|e| e.at_ns).max().unwrap_or(0)),
            workers: options.workers,
            keys: options.keys,
            acquires: 0,
            grants: 0,
            acquire_failures: 0,
            releases: 0,
            release_unknowns: 0,
            losses: 0,
            races_reset_retry: 0,
            races_shared_session: 0,
            losses_forced: 0,
            force_requests: 0,
            force_targets_gone: 0,
            forced_holds: 0,
            postgres: WriteCounts::default(),
            http: WriteCounts::default(),
            advisory: WriteCounts::default(),
            faults: extra.kinds.iter().map(|k| (*k, 0)).collect(),
            notes: extra.notes,
            epochs_advanced: 0,
            rehomes_moved: 0,
            rehomes_rolled_back: 0,
            spare_tier_holds: 0,
            etcd_holds: 0,
            restored_holds: 0,
            restored_holds_ended: 0,
            unmatched_hold_ends: extra.unmatched_ends,
            audit_rows: 0,
            audit_replayed: extra.audit_replayed,
            audit_gaps: extra.audit_gaps,
            audit_lost_with_cluster: 0,
            audit_dropped: extra.sink_dropped,
            tailer_caught_up: extra.tailer_caught_up,
            workers_failed: extra.workers_failed,
            violations: None,
            history: options.history.clone(),
        };
        for e in entries {
            match &e.event {
                Event::AcquireInvoked { .. } => s.acquires += 1,
                Event::Granted { .. } => s.grants += 1,
                Event::AcquireFailed { .. } => s.acquire_failures += 1,
                Event::Released { .. } => s.releases += 1,
                Event::ReleaseUnknown { .. } => s.release_unknowns += 1,
                Event::SessionRace { race, .. } => match race {
                    RaceKind::ResetRetry => s.races_reset_retry += 1,
                    RaceKind::SharedSession => s.races_shared_session += 1,
                },
                Event::Lost { reason, .. } => {
                    s.losses += 1;
                    if matches!(reason, Some(LossReason::Forced { .. })) {
                        s.losses_forced += 1;
                    }
                }
                Event::ForceRequested { .. } => s.force_requests += 1,
                Event::ForceApproved {
                    outcome: ForceOutcome::TargetGone,
                    ..
                } => s.force_targets_gone += 1,
                Event::EtcdForced { .. } => s.forced_holds += 1,
                Event::WriteCompleted {
                    target,
                    token,
                    outcome,
                    ..
                } => {
                    let counts = match (target, token) {
                        (_, None) => &mut s.advisory,
                        (Target::Postgres, Some(_)) => &mut s.postgres,
                        (Target::Http, Some(_)) => &mut s.http,
                    };
                    match outcome {
                        WriteOutcome::Committed { .. } => counts.committed += 1,
                        WriteOutcome::Rejected { .. } => counts.rejected += 1,
                        WriteOutcome::Indeterminate { .. } => counts.indeterminate += 1,
                    }
                }
                Event::Fault {
                    kind,
                    phase: Phase::Start,
                    ..
                } => *s.faults.entry(*kind).or_default() += 1,
                Event::EpochAdvanced { .. } => s.epochs_advanced += 1,
                Event::EtcdHold { tier, .. } => {
                    s.etcd_holds += 1;
                    if tier.is_some() {
                        s.spare_tier_holds += 1;
                    }
                }
                Event::Rehome { outcome, .. } => match outcome {
                    RehomeOutcome::Moved { .. } => s.rehomes_moved += 1,
                    RehomeOutcome::RolledBack { .. } => s.rehomes_rolled_back += 1,
                },
                Event::RestoredHold { end, .. } => {
                    s.restored_holds += 1;
                    if *end != HoldEnd::Open {
                        s.restored_holds_ended += 1;
                    }
                }
                Event::AuditRow { .. } => s.audit_rows += 1,
                _ => {}
            }
        }
        s
    }

    /// Operations: acquires, releases (acknowledged or not) and write attempts.
    pub fn operations(&self) -> u64 {
        let writes = |w: &WriteCounts| w.committed + w.rejected + w.indeterminate;
        self.acquires
            + self.releases
            + self.release_unknowns
            + writes(&self.postgres)
            + writes(&self.http)
            + writes(&self.advisory)
    }

    /// Stale writes the resources refused.
    pub fn stale_rejected(&self) -> u64 {
        self.postgres.rejected + self.http.rejected + self.advisory.rejected
    }

    /// Whether the run passed: every worker ran to the end, the audit tailer caught up,
    /// and the checker found no violation.
    pub fn passed(&self) -> bool {
        self.workers_failed.is_empty()
            && self.tailer_caught_up
            && self.violations.as_ref().is_some_and(Vec::is_empty)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "palisade chaos: seed {}, {:.1} s, {} workers, {} keys",
            self.seed,
            self.elapsed.as_secs_f64(),
            self.workers,
            self.keys
        )?;
        writeln!(f, "{:<34} {:>10}", "operations", self.operations())?;
        for (name, n) in [
            ("  acquires", self.acquires),
            ("  grants", self.grants),
            ("  acquires failed or timed out", self.acquire_failures),
            ("  releases", self.releases),
            ("  releases, outcome unknown", self.release_unknowns),
            ("  holds lost (loss signal)", self.losses),
            ("    told forced", self.losses_forced),
            ("force releases requested", self.force_requests),
            ("  answered force-target-gone", self.force_targets_gone),
            ("  holds forced (etcd's history)", self.forced_holds),
        ] {
            writeln!(f, "{name:<34} {n:>10}")?;
        }
        for (name, n) in [
            ("acquires sent again after a reset", self.races_reset_retry),
            ("acquires racing on one session", self.races_shared_session),
        ] {
            if n > 0 {
                writeln!(f, "{name:<34} {n:>10}")?;
            }
        }
        writeln!(
            f,
            "{:<34} {:>10} {:>10} {:>13}",
            "writes", "committed", "stale", "indeterminate"
        )?;
        for (name, w) in [
            ("  postgres, fenced_transaction", self.postgres),
            ("  http, FenceLayer", self.http),
            ("  http, advisory, no token", self.advisory),
        ] {
            writeln!(
                f,
                "{name:<34} {:>10} {:>10} {:>13}",
                w.committed, w.rejected, w.indeterminate
            )?;
        }
        writeln!(
            f,
            "{:<34} {:>10}",
            "stale writes rejected",
            self.stale_rejected()
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "faults injected",
            self.faults.values().sum::<u64>()
        )?;
        for (kind, n) in &self.faults {
            let name = serde_json::to_value(kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            writeln!(f, "  {name:<32} {n:>10}")?;
        }
        for note in &self.notes {
            writeln!(f, "{note}")?;
        }
        writeln!(f, "{:<34} {:>10}", "epochs advanced", self.epochs_advanced)?;
        writeln!(f, "{:<34} {:>10}", "rehomes moved", self.rehomes_moved)?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "rehomes rolled back", self.rehomes_rolled_back
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "holds in etcd's history", self.etcd_holds
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "  on the spare tier", self.spare_tier_holds
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "holds brought back by a restore", self.restored_holds
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "  ended by the restored cluster", self.restored_holds_ended
        )?;
        if self.unmatched_hold_ends > 0 {
            writeln!(
                f,
                "{:<34} {:>10}",
                "  hold ends matching no hold (!)", self.unmatched_hold_ends
            )?;
        }
        writeln!(f, "{:<34} {:>10}", "audit rows", self.audit_rows)?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "  restored history, left out", self.audit_replayed
        )?;
        writeln!(f, "{:<34} {:>10}", "  gaps", self.audit_gaps)?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "  lost with a restored cluster", self.audit_lost_with_cluster
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "  write events dropped by the sink", self.audit_dropped
        )?;
        writeln!(
            f,
            "{:<34} {:>10}",
            "  tailer caught up",
            if self.tailer_caught_up { "yes" } else { "NO" }
        )?;
        for w in &self.workers_failed {
            writeln!(f, "{w}")?;
        }
        match &self.violations {
            Some(v) => {
                writeln!(f, "{:<34} {:>10}", "violations", v.len())?;
                for line in v {
                    writeln!(f, "  {line}")?;
                }
            }
            None => writeln!(f, "{:<34} {:>10}", "violations", "not checked")?,
        }
        write!(f, "history: {}", self.history.display())
    }
}
