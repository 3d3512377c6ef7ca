//! Rules (g) force release and (h) releases: one violation of each kind, injected into a
//! valid history.

use palisade_chaos::check::{check, ViolationKind};
use palisade_chaos::history::{Entry, Event, ForceOutcome, HoldEnd, LossReason};

use crate::assert_only;
use crate::model::{lock, Sim};
use crate::scenario::scenario;

fn find(h: &[Entry], what: impl Fn(&Event) -> bool) -> usize {
    h.iter()
        .position(|e| what(&e.event))
        .expect("the history has such an entry")
}

/// The `etcd_hold` entry of the hold granted at `rev`.
fn etcd_hold(h: &[Entry], rev: i64) -> usize {
    find(
        h,
        |e| matches!(e, Event::EtcdHold { grant_rev, .. } if *grant_rev == rev),
    )
}

fn grant_rev(token: u64) -> i64 {
    (token & ((1 << 48) - 1)) as i64
}

#[test]
fn forced_outside_targets_a_force_ends_the_hold_granted_after_its_request() {
    // Worker 0 holds a; an admin's request names that grant; worker 0 releases and
    // acquires a again; the approval forces the new hold.
    let mut sim = Sim::new();
    let a = lock("a");
    let first = sim.acquire(0, &a, true);
    sim.release(&first);
    let second = sim.acquire(0, &a, true);
    sim.force(&second);
    let mut h = sim.finish();
    assert!(check(&h).is_ok(), "{}", check(&h));
    let request = find(&h, |e| matches!(e, Event::ForceRequested { .. }));
    let Event::ForceRequested { targets, .. } = &mut h[request].event else {
        unreachable!()
    };
    *targets = vec![grant_rev(first.token)];
    let forced = find(&h, |e| matches!(e, Event::EtcdForced { .. }));
    assert_only(
        &check(&h),
        ViolationKind::ForcedOutsideTargets,
        &[forced, request],
    );
}

#[test]
fn forced_outside_targets_a_force_by_a_request_never_made() {
    let mut h = scenario();
    let request = find(&h, |e| matches!(e, Event::ForceRequested { .. }));
    let Event::ForceRequested { request_id, .. } = &mut h[request].event else {
        unreachable!()
    };
    *request_id = "another-request".into();
    let forced = find(&h, |e| matches!(e, Event::EtcdForced { .. }));
    let report = check(&h);
    assert_only(&report, ViolationKind::ForcedOutsideTargets, &[forced]);
    assert!(
        report.to_string().contains("which was never made"),
        "{report}"
    );
}

#[test]
fn force_answer_false_target_gone_while_the_request_ended_a_hold() {
    let mut h = scenario();
    let approval = find(&h, |e| matches!(e, Event::ForceApproved { .. }));
    let Event::ForceApproved { outcome, .. } = &mut h[approval].event else {
        unreachable!()
    };
    *outcome = ForceOutcome::TargetGone;
    let forced = find(&h, |e| matches!(e, Event::EtcdForced { .. }));
    assert_only(
        &check(&h),
        ViolationKind::ForceAnswerFalse,
        &[approval, forced],
    );
}

#[test]
fn force_answer_false_a_released_hold_that_no_force_ended() {
    let mut h = scenario();
    let approval = find(&h, |e| matches!(e, Event::ForceApproved { .. }));
    let Event::ForceApproved { outcome, .. } = &mut h[approval].event else {
        unreachable!()
    };
    let ForceOutcome::Released { grant_revs } = outcome else {
        panic!("the scenario's approval released a hold: {outcome:?}")
    };
    grant_revs.push(grant_revs[0] + 1);
    let report = check(&h);
    assert_only(&report, ViolationKind::ForceAnswerFalse, &[approval]);
    assert_eq!(report.violations.len(), 1, "{report}");
}

#[test]
fn forced_hold_not_told_when_no_loss_is_recorded() {
    let mut h = scenario();
    let forced = find(&h, |e| matches!(e, Event::EtcdForced { .. }));
    let lost = find(&h, |e| {
        matches!(
            e,
            Event::Lost {
                reason: Some(LossReason::Forced { .. }),
                ..
            }
        )
    });
    // The loss names another token: the forced hold's worker was never told.
    let Event::Lost { token, .. } = &mut h[lost].event else {
        unreachable!()
    };
    *token += 1;
    let grant = find(
        &h,
        |e| matches!(e, Event::Granted { token: t, .. } if *t + 1 == *token_of(&h[lost].event)),
    );
    assert_only(
        &check(&h),
        ViolationKind::ForcedHoldNotTold,
        &[forced, grant],
    );
}

fn token_of(e: &Event) -> &u64 {
    match e {
        Event::Lost { token, .. } => token,
        _ => unreachable!(),
    }
}

#[test]
fn forced_hold_not_told_when_a_release_succeeds_after_the_approval() {
    let mut sim = Sim::new();
    let a = lock("a");
    let held = sim.acquire(0, &a, true);
    sim.force(&held);
    let mut h = sim.finish();
    assert!(check(&h).is_ok(), "{}", check(&h));
    let approval = find(&h, |e| matches!(e, Event::ForceApproved { .. }));
    // The worker's release is acknowledged after the approval answered.
    let released = approval + 1;
    h.insert(
        released,
        Entry {
            at_ns: h[approval].at_ns + 5,
            worker: 0,
            event: Event::Released {
                lock: a.clone(),
                token: held.token,
                release_rev: None,
            },
        },
    );
    let forced = find(&h, |e| matches!(e, Event::EtcdForced { .. }));
    let grant = find(&h, |e| matches!(e, Event::Granted { .. }));
    assert_only(
        &check(&h),
        ViolationKind::ForcedHoldNotTold,
        &[forced, grant, released],
    );
}

/// Worker 0 holds a in session `S`, releases it (acknowledged, or outcome unknown), and
/// is granted b in the same session; then the first hold ends as `end` decides.
fn release_then_acquire(unknown: bool, end: Option<HoldEnd>) -> (Vec<Entry>, [usize; 3]) {
    const S: i64 = 0x7000;
    let mut sim = Sim::new();
    let (a, b) = (lock("a"), lock("b"));
    let first = sim.acquire_in(0, &a, true, S);
    let release = if unknown {
        sim.record(
            0,
            Event::ReleaseUnknown {
                lock: a.clone(),
                token: first.token,
            },
        )
    } else {
        sim.record(
            0,
            Event::Released {
                lock: a.clone(),
                token: first.token,
                release_rev: None,
            },
        )
    };
    let second = sim.acquire_in(0, &b, true, S);
    if let Some(end) = end {
        sim.end_quietly(&first, end);
    }
    let h = sim.finish();
    let named = [
        release,
        etcd_hold(&h, grant_rev(first.token)),
        etcd_hold(&h, grant_rev(second.token)),
    ];
    (h, named)
}

#[test]
fn release_left_held_an_acknowledged_release_whose_hold_outlived_the_next_grant() {
    // The service said released, but the hold was deleted only after the session's next
    // grant.
    let (h, named) = release_then_acquire(false, Some(HoldEnd::Released));
    assert_only(&check(&h), ViolationKind::ReleaseLeftHeld, &named);
    // ... or never: it expired with the session.
    let (h, named) = release_then_acquire(false, Some(HoldEnd::Expired));
    assert_only(&check(&h), ViolationKind::ReleaseLeftHeld, &named);
}

#[test]
fn release_left_held_an_unknown_release_that_never_landed_while_the_session_lived() {
    // The background release landed after the next grant: fine.
    let (h, _) = release_then_acquire(true, Some(HoldEnd::Released));
    assert!(check(&h).is_ok(), "{}", check(&h));
    // It never landed: the hold stayed until the session expired, or to the end.
    let (h, named) = release_then_acquire(true, Some(HoldEnd::Expired));
    assert_only(&check(&h), ViolationKind::ReleaseLeftHeld, &named);
    let (h, named) = release_then_acquire(true, None);
    assert_only(&check(&h), ViolationKind::ReleaseLeftHeld, &named);
}

fn force_record(h: &[Entry]) -> usize {
    find(
        h,
        |e| matches!(e, Event::AuditRow { kind, .. } if kind == "force_release"),
    )
}

#[test]
fn audit_missing_the_force_release_record_of_a_forced_hold() {
    let mut h = scenario();
    let record = force_record(&h);
    // The replica never wrote its record: the entry becomes one that says nothing.
    h[record].event = Event::Fault {
        kind: palisade_chaos::history::FaultKind::ForceRelease,
        phase: palisade_chaos::history::Phase::End,
        detail: "in place of the force release record".into(),
        paused_worker: None,
    };
    let forced = find(&h, |e| {
        matches!(
            e,
            Event::EtcdHold {
                end: HoldEnd::Forced,
                ..
            }
        )
    });
    let report = check(&h);
    assert_only(&report, ViolationKind::AuditMissing, &[forced]);
    assert!(report.to_string().contains("force_release of"), "{report}");
}

#[test]
fn audit_duplicate_force_release_records_of_one_forced_hold() {
    let mut h = scenario();
    let record = force_record(&h);
    let mut copy = h[record].clone();
    copy.at_ns = h.last().unwrap().at_ns + 10;
    h.push(copy);
    let copy = h.len() - 1;
    assert_only(&check(&h), ViolationKind::AuditDuplicate, &[record, copy]);
}
