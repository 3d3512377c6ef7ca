//! `palisade chaos` for 60 seconds with a fixed seed: the real binary, on its own
//! three-member etcd, private PostgreSQL, lock-service replicas and worker processes
//! (the test starts etcd: `etcd` in its name, so nextest runs it alone).

use std::collections::BTreeMap;
use std::process::Command;

use palisade_chaos::history::{read_history, Event, FaultKind, Phase, WriteOutcome};
use palisade_chaos::schedule::ALL_KINDS;

/// The seed of the CI run.
const SEED: &str = "20261130";

#[test]
fn chaos_etcd_sixty_seconds_no_stale_write_lands() {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["chaos", "--seed", SEED, "--duration", "60s", "--workers", "4", "--keys", "3", "--history"])
        .arg(&history)
        .output()
        .expect("running palisade chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "palisade chaos failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains(&format!("history: {}", history.display())), "{stdout}");

    let entries = read_history(std::io::BufReader::new(std::fs::File::open(&history).unwrap())).unwrap();
    let report = palisade_chaos::check::check(&entries);
    assert!(report.violations.is_empty(), "violations: {:#?}\n{stdout}", report.violations);

    let mut faults: BTreeMap<FaultKind, u32> = BTreeMap::new();
    let (mut grants, mut stale, mut committed, mut holds, mut audit) = (0, 0, 0, 0, 0);
    for e in &entries {
        match &e.event {
            Event::Fault { kind, phase: Phase::Start, .. } => *faults.entry(*kind).or_default() += 1,
            Event::Granted { .. } => grants += 1,
            Event::WriteCompleted { outcome: WriteOutcome::Rejected { .. }, .. } => stale += 1,
            Event::WriteCompleted { outcome: WriteOutcome::Committed { .. }, .. } => committed += 1,
            Event::EtcdHold { .. } => holds += 1,
            Event::AuditRow { .. } => audit += 1,
            _ => {}
        }
    }
    for kind in ALL_KINDS {
        assert!(faults.get(&kind).copied().unwrap_or(0) >= 1, "{kind:?} was never injected: {faults:?}\n{stdout}");
    }
    assert!(stale >= 1, "no stale write was rejected\n{stdout}");
    assert!(grants > 0 && committed > 0, "grants {grants}, committed writes {committed}\n{stdout}");
    assert!(holds > 0 && audit > 0, "etcd holds {holds}, audit rows {audit}\n{stdout}");
    let summary_violations = stdout.lines().find(|l| l.starts_with("violations")).and_then(|l| l.split_whitespace().last());
    assert_eq!(summary_violations, Some("0"), "{stdout}");
}
