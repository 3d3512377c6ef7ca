//! `palisade chaos` for 60 seconds with a fixed seed: the real binary, on its own two
//! etcd tiers (three members and one), private PostgreSQL, lock-service replicas and
//! worker processes, each on a network host of its own (the test runs as root, as CI
//! does), with every fault kind in its plan, the network ones and the rehome included:
//! the plan's first round moves the workers' namespace to the second tier (the test
//! starts etcd: `etcd` in its name, so nextest runs it alone).
//!
//! The workload's session races (`PALISADE_CHAOS_RACES`, see [`RACES`]) are on in this
//! run: acquires whose connection is reset, and a second task on the same session. The
//! test also checks that both kinds of race ran.
//!
//! The run's summary is printed whether it passes or not (see it with `--no-capture`).
//! When the test fails, its history is kept in `<target>/test-artifacts/` and the failure
//! names it, with the seed, the summary, the run's stderr, and every violation followed by
//! the history entries it names.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use palisade_chaos::check::{CheckReport, EntryIndex};
use palisade_chaos::history::{
    read_history, Entry, Event, FaultKind, Phase, RaceKind, RehomeOutcome, WriteOutcome,
};
use palisade_chaos::schedule::{ALL_KINDS, NET_KINDS};

/// The seed of the CI run.
const SEED: &str = "20261130";

/// The workload's session races: `on` or `off` (`PALISADE_CHAOS_RACES`). With them on,
/// some acquires are sent again after their connection was reset while the service
/// worked on them, and some race a second task on the same session; a service that ends
/// a hold behind its holder's back then fails the checker's rule (j).
const RACES: &str = "on";

/// Violations listed with their entries in a failure message, at most.
const SHOWN: usize = 20;

/// Where a failed run's history is kept: `test-artifacts/` in the target directory.
fn artifacts() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .expect("the target directory")
        .join("test-artifacts")
}

/// Copies the history to the artifacts directory; returns where it is, or why not.
fn keep(history: &Path) -> String {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dir = artifacts();
    let kept = dir.join(format!("chaos-{SEED}-{stamp}.jsonl"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(history, &kept)) {
        Ok(_) => kept.display().to_string(),
        Err(e) => format!("(not kept: copying {} failed: {e})", history.display()),
    }
}

/// Every violation (the first [`SHOWN`]) with the entries it names, one JSON line each.
fn violations(report: &CheckReport, entries: &[Entry]) -> String {
    let mut text = String::new();
    for v in report.violations.iter().take(SHOWN) {
        let _ = writeln!(text, "- {v}");
        let mut named = v.entries();
        named.sort();
        named.dedup();
        for EntryIndex(i) in named {
            let line = entries
                .get(i)
                .and_then(|e| serde_json::to_string(e).ok())
                .unwrap_or_default();
            let _ = writeln!(text, "    #{i}: {line}");
        }
    }
    if report.violations.len() > SHOWN {
        let _ = writeln!(
            text,
            "({} more; run `palisade chaos check` on the history)",
            report.violations.len() - SHOWN
        );
    }
    text
}

#[test]
fn chaos_etcd_sixty_seconds_no_stale_write_lands() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "chaos",
            "--seed",
            SEED,
            "--duration",
            "60s",
            "--workers",
            "4",
            "--keys",
            "3",
            "--history",
        ])
        .arg(&history)
        .env(palisade_chaos::RACES_ENV, RACES)
        .output()
        .expect("running palisade chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    let entries = std::fs::File::open(&history)
        .map_err(|e| e.to_string())
        .and_then(|f| read_history(std::io::BufReader::new(f)).map_err(|e| e.to_string()));
    let report = entries
        .as_ref()
        .ok()
        .map(|e| palisade_chaos::check::check(e));
    let fail = |what: String| -> ! {
        let kept = if history.exists() {
            keep(&history)
        } else {
            "(none was written)".to_owned()
        };
        let found = match (&report, &entries) {
            (Some(r), Ok(e)) if !r.is_ok() => violations(r, e),
            (Some(_), Ok(_)) => "none\n".to_owned(),
            (_, Err(e)) => format!("the history could not be read: {e}\n"),
            (None, Ok(_)) => unreachable!("a read history is checked"),
        };
        panic!(
            "{what}\nseed {SEED}; history: {kept}\nviolations:\n{found}--- summary (stdout)\n{stdout}\n--- stderr\n{stderr}"
        );
    };
    if !out.status.success() {
        fail(format!("palisade chaos failed ({})", out.status));
    }
    if !stdout.contains(&format!("history: {}", history.display())) {
        fail("the summary does not name the history".into());
    }
    let (Some(report), Ok(entries)) = (&report, &entries) else {
        fail("the history was not checked".into())
    };
    if !report.is_ok() {
        fail(format!(
            "{} violation(s) in the history",
            report.violations.len()
        ));
    }

    let mut faults: BTreeMap<FaultKind, u32> = BTreeMap::new();
    let (mut grants, mut stale, mut committed, mut holds, mut audit) = (0, 0, 0, 0, 0);
    let mut renewals = 0;
    let mut races: BTreeMap<RaceKind, u32> = BTreeMap::new();
    for e in entries {
        match &e.event {
            Event::Fault {
                kind,
                phase: Phase::Start,
                ..
            } => *faults.entry(*kind).or_default() += 1,
            Event::Granted { .. } => grants += 1,
            Event::WriteCompleted {
                outcome: WriteOutcome::Rejected { .. },
                ..
            } => stale += 1,
            Event::WriteCompleted {
                outcome: WriteOutcome::Committed { .. },
                ..
            } => committed += 1,
            Event::EtcdHold { .. } => holds += 1,
            Event::AuditRow { .. } => audit += 1,
            Event::Renewed { .. } => renewals += 1,
            Event::SessionRace { race, .. } => *races.entry(*race).or_default() += 1,
            _ => {}
        }
    }
    // Each kind is in the plan's first round, which always completes: one of each,
    // every partition kind included, by construction. netem only where the kernel has it.
    let mut kinds = [&ALL_KINDS[..], &NET_KINDS[..]].concat();
    if !stdout.contains("netem_latency not planned") {
        kinds.push(FaultKind::NetemLatency);
    }
    for kind in kinds {
        if faults.get(&kind).copied().unwrap_or(0) == 0 {
            fail(format!("{kind:?} was never injected: {faults:?}"));
        }
    }
    if stale == 0 {
        fail("no stale write was rejected".into());
    }
    if grants == 0 || committed == 0 {
        fail(format!("grants {grants}, committed writes {committed}"));
    }
    // The loss-signal deadline is checked against the renewals the workers recorded.
    if renewals == 0 {
        fail("no worker recorded a renewal".into());
    }
    let raced = [RaceKind::ResetRetry, RaceKind::SharedSession]
        .iter()
        .all(|r| races.contains_key(r));
    if (RACES == "on") != raced {
        fail(format!("session races {RACES}, races run: {races:?}"));
    }
    if holds == 0 || audit == 0 {
        fail(format!("etcd holds {holds}, audit rows {audit}"));
    }
    // The plan's first round has a rehome: it moved the namespace, with the new tier's
    // epoch advance recorded before it, or the service rolled it back.
    let mut rehomes = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let Event::Rehome { to, outcome, .. } = &e.event else {
            continue;
        };
        let shown = match outcome {
            RehomeOutcome::Moved { epoch } => entries[..i].iter().any(|p| {
                matches!(&p.event, Event::EpochAdvanced { epoch: advanced, tier }
                    if advanced == epoch && tier.as_deref().unwrap_or("home") == to)
            }),
            RehomeOutcome::RolledBack { .. } => true,
        };
        rehomes.push((i, outcome.clone(), shown));
    }
    if rehomes.is_empty() || rehomes.iter().any(|(_, _, shown)| !shown) {
        fail(format!(
            "no rehome, or a move without its epoch advance: {rehomes:?}"
        ));
    }
    // Both tiers' revisions were placed in real time for the cross-tier rule.
    let marked = |spare: bool| {
        entries.iter().any(
            |e| matches!(&e.event, Event::RevisionSeen { tier, .. } if tier.is_some() == spare),
        )
    };
    if !marked(false) || !marked(true) {
        fail("revision marks are missing for a tier".into());
    }
    let summary_violations = stdout
        .lines()
        .find(|l| l.starts_with("violations"))
        .and_then(|l| l.split_whitespace().last());
    if summary_violations != Some("0") {
        fail(format!(
            "the summary's violations line says {summary_violations:?}"
        ));
    }
}
