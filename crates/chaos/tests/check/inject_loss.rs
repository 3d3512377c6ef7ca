//! Rule (i): the loss signal within the session's TTL of its last renewal plus the slack,
//! and no write with a lost hold's token after it. Each history is valid but for the one
//! injected violation.

use palisade_chaos::check::{check, Violation, ViolationKind, LOSS_SIGNAL_SLACK};
use palisade_chaos::history::{Entry, Event, FaultKind, HoldEnd, LossReason, Phase, Target};

use crate::assert_only;
use crate::model::{lock, Hold, Sim, RUNNER};
use crate::scenario::scenario;

const SESSION: i64 = 0x77;
const TTL_MS: u64 = 3_000;
const SEC: u64 = 1_000_000_000;

/// Worker 0 opens a session (renewed at its open), is granted lock `a` in it and writes
/// once. Returns the sim, the hold and the session's expiry.
fn holder() -> (Sim, Hold, u64) {
    let mut sim = Sim::new();
    let sent_ns = sim.now();
    renewed(&mut sim, sent_ns);
    let hold = sim.acquire_in(0, &lock("a"), true, SESSION);
    sim.write(0, "row-a", Target::Postgres, Some(hold.token));
    (sim, hold, sent_ns + TTL_MS * 1_000_000)
}

fn renewed(sim: &mut Sim, sent_ns: u64) -> usize {
    sim.record(
        0,
        Event::Renewed {
            session: SESSION,
            sent_ns,
            ttl_ms: TTL_MS,
        },
    )
}

/// Moves the clock so that the next entry is recorded at `at` (ns).
fn to(sim: &mut Sim, at: u64) {
    let now = sim.now();
    assert!(at > now + 10, "{at} is not after {now}");
    sim.advance(at - now - 10);
}

fn pause(sim: &mut Sim, phase: Phase, worker: Option<u32>) -> usize {
    sim.record(
        RUNNER,
        Event::Fault {
            kind: FaultKind::PauseWorker,
            phase,
            detail: "worker 0".into(),
            paused_worker: worker,
        },
    )
}

fn expires_and_told(sim: &mut Sim, hold: &Hold, told_at: u64) -> usize {
    sim.end_quietly(hold, HoldEnd::Expired);
    to(sim, told_at);
    sim.tell_lost(hold, LossReason::SessionEnded)
}

fn slack() -> u64 {
    LOSS_SIGNAL_SLACK.as_nanos() as u64
}

#[test]
fn told_within_the_ttl_and_the_slack_passes() {
    let (mut sim, hold, expiry) = holder();
    expires_and_told(&mut sim, &hold, expiry + slack() - 1);
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.counts.renewals, 1);
}

#[test]
fn loss_signal_late_after_the_slack() {
    let (mut sim, hold, expiry) = holder();
    let grant = sim.entries.len() - 3;
    assert!(matches!(sim.entries[grant].event, Event::Granted { .. }));
    let lost = expires_and_told(&mut sim, &hold, expiry + slack() + 1);
    let report = check(&sim.finish());
    assert_only(&report, ViolationKind::LossSignalLate, &[grant, lost]);
    assert_eq!(report.violations.len(), 1);
    match &report.violations[0] {
        Violation::LossSignalLate {
            worker,
            expiry_ns,
            deadline_ns,
            ..
        } => {
            assert_eq!(*worker, 0);
            assert_eq!(*expiry_ns, expiry);
            assert_eq!(*deadline_ns, expiry + slack());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn loss_signal_late_when_never_told_and_recording_on() {
    // The worker is never told; a write it invokes after the deadline shows it was alive.
    let (mut sim, hold, expiry) = holder();
    sim.end_quietly(&hold, HoldEnd::Expired);
    to(&mut sim, expiry + slack() + 5);
    let w = sim.begin_write(0, "row-a", Target::Postgres, Some(hold.token));
    let late = sim.entries.len() - 1;
    sim.finish_write(&w);
    let report = check(&sim.finish());
    assert_only(&report, ViolationKind::LossSignalLate, &[late]);
    assert_eq!(report.violations.len(), 1, "one late hold, one violation");
}

#[test]
fn renewals_move_the_deadline_on() {
    let (mut sim, hold, first) = holder();
    // Renewed twice, a second apart: the session lives 2 s longer.
    for n in 1..=2 {
        to(&mut sim, n * SEC);
        renewed(&mut sim, n * SEC - 1_000);
    }
    let later = 2 * SEC - 1_000 + TTL_MS * 1_000_000;
    assert!(later > first + SEC);
    expires_and_told(&mut sim, &hold, later + slack() - 1);
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.counts.renewals, 3);

    // Told just after the moved deadline: late.
    let (mut sim, hold, _) = holder();
    for n in 1..=2 {
        to(&mut sim, n * SEC);
        renewed(&mut sim, n * SEC - 1_000);
    }
    let later = 2 * SEC - 1_000 + TTL_MS * 1_000_000;
    let lost = expires_and_told(&mut sim, &hold, later + slack() + 1);
    assert_only(
        &check(&sim.finish()),
        ViolationKind::LossSignalLate,
        &[lost],
    );
}

#[test]
fn a_pause_of_the_worker_across_the_expiry_moves_the_deadline_to_its_end() {
    let run = |worker: Option<u32>| {
        let (mut sim, hold, expiry) = holder();
        to(&mut sim, expiry - SEC);
        pause(&mut sim, Phase::Start, worker);
        to(&mut sim, expiry + 3 * SEC);
        pause(&mut sim, Phase::End, worker);
        let lost = expires_and_told(&mut sim, &hold, expiry + 3 * SEC + slack() - 1);
        (check(&sim.finish()), lost)
    };
    let (report, _) = run(Some(0));
    assert!(report.is_ok(), "{report}");
    // The same pause not naming the worker does not excuse it.
    let (report, lost) = run(None);
    assert_only(&report, ViolationKind::LossSignalLate, &[lost]);
    // Nor does a pause of another worker.
    let (report, lost) = run(Some(1));
    assert_only(&report, ViolationKind::LossSignalLate, &[lost]);
}

#[test]
fn a_grant_answered_after_the_expiry_is_told_within_the_slack_of_the_grant() {
    // The acquire long-polled across the client's expiry; the service granted on the
    // lease it still had. The client says the session is lost at once.
    let run = |told_after_grant: u64| {
        let mut sim = Sim::new();
        let sent_ns = sim.now();
        renewed(&mut sim, sent_ns);
        to(&mut sim, sent_ns + TTL_MS * 1_000_000 + 2 * SEC);
        let hold = sim.acquire_in(0, &lock("a"), true, SESSION);
        let granted = sim.now();
        let lost = expires_and_told(&mut sim, &hold, granted + told_after_grant);
        (check(&sim.finish()), lost)
    };
    let (report, _) = run(1_000);
    assert!(report.is_ok(), "{report}");
    let (report, lost) = run(slack() + 1);
    assert_only(&report, ViolationKind::LossSignalLate, &[lost]);
}

#[test]
fn a_release_ends_the_obligation() {
    let (mut sim, hold, expiry) = holder();
    sim.release(&hold);
    to(&mut sim, expiry + 5 * SEC);
    // The worker goes on recording long after its session's expiry: nothing is owed.
    sim.fail_acquire(0, &lock("b"));
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");
}

#[test]
fn write_after_loss_in_the_scenario() {
    // The scenario's paused worker 0 is told before its stale writes instead of after.
    let mut h: Vec<Entry> = scenario();
    let lost = h
        .iter()
        .position(|e| e.worker == 0 && matches!(e.event, Event::Lost { .. }))
        .expect("worker 0 is told");
    let Event::Lost { token, .. } = h[lost].event.clone() else {
        unreachable!()
    };
    let writes: Vec<usize> = (0..lost)
        .filter(|&i| {
            h[i].worker == 0
                && matches!(h[i].event, Event::WriteInvoked { token: Some(t), .. } if t == token)
        })
        .collect();
    // Told right after the pause ended, before its two stale writes.
    let end = h
        .iter()
        .position(|e| {
            matches!(
                e.event,
                Event::Fault {
                    kind: FaultKind::PauseWorker,
                    phase: Phase::End,
                    ..
                }
            )
        })
        .unwrap();
    h[lost].at_ns = h[end].at_ns + 1;
    let stale: Vec<usize> = writes.into_iter().filter(|&i| i > end).collect();
    assert_eq!(stale.len(), 3, "the scenario's stale writes of worker 0");
    let report = check(&h);
    let mut named = stale.clone();
    named.push(lost);
    assert_only(&report, ViolationKind::WriteAfterLoss, &named);
    assert_eq!(report.violations.len(), 3);
}
