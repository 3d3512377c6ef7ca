//! Rule (j): a hold a worker was granted ends only by its own release or in a way it was
//! told of. The sequence it was made for, two live acquires of one lock on one session:
//!
//! - rev 13: the first attempt's hold is created, and that attempt is answered 200;
//! - rev 14: the session's other attempt deletes that hold, taking it for a leftover;
//! - rev 15: another session is granted the lock;
//! - rev 16: the other attempt enqueues again at the back.
//!
//! The first caller holds a 200 and is never told: its session lives and the hold is not
//! listed as forced.

use palisade_chaos::check::{check, Violation, ViolationKind, LOSS_SIGNAL_SLACK};
use palisade_chaos::history::{Entry, Event, HoldEnd, LossReason, RaceKind, Target, WriteOutcome};

use crate::assert_only;
use crate::model::{lock, Hold, Sim};

/// The session of worker 0, whose two tasks race.
const SHARED: i64 = 0x51;
/// The session of worker 1.
const OTHER: i64 = 0x52;

fn grant_rev(token: u64) -> i64 {
    (token & ((1 << 48) - 1)) as i64
}

/// The `etcd_hold` entry of the hold granted at `rev`.
fn etcd_hold(h: &[Entry], rev: i64) -> usize {
    h.iter()
        .position(|e| matches!(e.event, Event::EtcdHold { grant_rev, .. } if grant_rev == rev))
        .expect("etcd's history lists the hold")
}

/// Where the defect left worker 0: what it was granted at rev 13 (the `granted` entry),
/// with its second task's acquire still waiting.
struct Defect {
    sim: Sim,
    first: Hold,
    grant: usize,
}

/// Worker 0's two tasks acquire `a` on one session; the first is granted at rev 13 and
/// writes; the second deletes that hold at rev 14; worker 1 is granted `a` at rev 15 and
/// writes; the second task enqueues again at rev 16.
fn defect() -> Defect {
    let mut sim = Sim::new();
    sim.set_rev(12);
    let a = lock("a");
    sim.record(
        0,
        Event::SessionRace {
            lock: a.clone(),
            race: RaceKind::SharedSession,
        },
    );
    sim.record(0, Event::AcquireInvoked { lock: a.clone() });
    let first = sim.acquire_in(0, &a, true, SHARED);
    let grant = sim.entries.len() - 1;
    assert_eq!(grant_rev(first.token), 13);
    assert!(matches!(
        sim.write(0, "row-a", Target::Postgres, Some(first.token)),
        WriteOutcome::Committed { .. }
    ));
    // Rev 14: the session's other attempt deletes the hold with its (absent) record, as
    // a release does.
    sim.end_quietly(&first, HoldEnd::Released);
    assert_eq!(sim.rev(), 14);
    let other = sim.acquire_in(1, &a, true, OTHER);
    assert_eq!(grant_rev(other.token), 15);
    sim.write(1, "row-a", Target::Postgres, Some(other.token));
    assert_eq!(sim.other_write(), 16);
    sim.release(&other);
    Defect { sim, first, grant }
}

#[test]
fn hold_ended_untold_when_the_sessions_other_acquire_deleted_it() {
    let Defect {
        mut sim,
        first,
        grant,
    } = defect();
    // The first task, never told, writes on: fencing refuses it. Its release is then
    // refused (not held): it finds out, too late.
    let refused = sim.write(0, "row-a", Target::Postgres, Some(first.token));
    assert!(matches!(refused, WriteOutcome::Rejected { .. }));
    let found_out = sim.tell_lost(&first, LossReason::NotHeld);
    // The second task is granted after worker 1's release, and releases at once: both
    // of the worker's racing acquires were answered 200.
    let second = sim.grant_in(0, &lock("a"), true, SHARED);
    assert_eq!(grant_rev(second.token), 18);
    sim.release(&second);
    let h = sim.finish();
    let hold = etcd_hold(&h, 13);
    let report = check(&h);
    assert_only(
        &report,
        ViolationKind::HoldEndedUntold,
        &[hold, grant, found_out],
    );
    assert_eq!(report.violations.len(), 1, "{report}");
    match &report.violations[0] {
        Violation::HoldEndedUntold {
            lock: l,
            hold: held,
            grant: g,
            worker,
            found_out: f,
        } => {
            assert_eq!(*l, lock("a"));
            assert_eq!((held.grant_rev, held.end_rev), (13, Some(14)));
            assert_eq!(held.entry.0, hold);
            assert_eq!((g.0, *worker, f.map(|e| e.0)), (grant, 0, Some(found_out)));
        }
        other => panic!("{other:?}"),
    }
    let text = report.to_string();
    assert!(
        text.contains("X hold [13, 14)")
            && text.contains("neither released it nor was told")
            && text.contains(&format!("its own release refused (entry #{found_out})")),
        "{text}"
    );
}

#[test]
fn hold_ended_untold_when_the_holder_never_hears_of_it() {
    // The history ends with the first task still counting on its hold.
    let Defect { sim, grant, .. } = defect();
    let h = sim.finish();
    let hold = etcd_hold(&h, 13);
    let report = check(&h);
    assert_only(&report, ViolationKind::HoldEndedUntold, &[hold, grant]);
    assert!(
        matches!(
            report.violations[..],
            [Violation::HoldEndedUntold {
                found_out: None,
                ..
            }]
        ),
        "{report}"
    );
}

#[test]
fn the_same_sequence_with_the_holders_own_release_passes() {
    // Rev 14 is the first task's own release: what a correct service does.
    let mut sim = Sim::new();
    sim.set_rev(12);
    let a = lock("a");
    let first = sim.acquire_in(0, &a, true, SHARED);
    sim.write(0, "row-a", Target::Postgres, Some(first.token));
    sim.release(&first);
    let other = sim.acquire_in(1, &a, true, OTHER);
    sim.write(1, "row-a", Target::Postgres, Some(other.token));
    sim.other_write();
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");
}

#[test]
fn a_release_the_worker_let_go_may_land_later_or_be_finished_by_its_session() {
    // Outcome unknown: the client's background retry (or the session's next acquire,
    // naming it) deletes it later; given up: the session's close ends it.
    let mut sim = Sim::new();
    let a = lock("a");
    let unknown = sim.acquire_in(0, &a, true, SHARED);
    sim.release_unknown(&unknown);
    let given_up = sim.acquire_in(0, &a, true, SHARED);
    sim.record(
        0,
        Event::Abandoned {
            lock: a.clone(),
            token: given_up.token,
        },
    );
    sim.end_quietly(&given_up, HoldEnd::Released);
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");
}

#[test]
fn an_expiry_the_holder_was_told_of_passes_and_an_untold_one_is_rule_i() {
    let run = |told: bool| {
        let mut sim = Sim::new();
        let sent_ns = sim.now();
        let ttl_ms = 3_000;
        sim.record(
            0,
            Event::Renewed {
                session: SHARED,
                sent_ns,
                ttl_ms,
            },
        );
        let hold = sim.acquire_in(0, &lock("a"), true, SHARED);
        sim.end_quietly(&hold, HoldEnd::Expired);
        let late = LOSS_SIGNAL_SLACK.as_nanos() as u64 + ttl_ms * 1_000_000;
        if told {
            sim.tell_lost(&hold, LossReason::SessionEnded);
        }
        sim.advance(late);
        let next = sim.entries.len();
        sim.fail_acquire(0, &lock("b"));
        (check(&sim.finish()), next)
    };
    let (report, _) = run(true);
    assert!(report.is_ok(), "{report}");
    let (report, next) = run(false);
    assert_only(&report, ViolationKind::LossSignalLate, &[next]);
}

#[test]
fn a_force_the_holder_was_told_of_passes_and_an_untold_one_is_rule_g() {
    let mut sim = Sim::new();
    let hold = sim.acquire_in(0, &lock("a"), true, SHARED);
    sim.force(&hold);
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");

    let mut sim = Sim::new();
    let hold = sim.acquire_in(0, &lock("a"), true, SHARED);
    sim.force_untold(&hold);
    let report = check(&sim.finish());
    assert_only(&report, ViolationKind::ForcedHoldNotTold, &[]);
}

#[test]
fn a_hold_whose_session_etcd_does_not_name_is_outside_the_rule() {
    // The model's plain `acquire` records no session in etcd's history (as histories
    // written before it was recorded): the grant cannot be joined to the hold.
    let mut sim = Sim::new();
    let hold = sim.acquire(0, &lock("a"), true);
    sim.end_quietly(&hold, HoldEnd::Released);
    let report = check(&sim.finish());
    assert!(report.is_ok(), "{report}");
}
