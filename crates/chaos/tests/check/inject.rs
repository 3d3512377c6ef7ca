//! One violation of each kind, injected into the valid scenario.

use palisade_chaos::check::{check, Violation, ViolationKind};
use palisade_chaos::history::{Entry, Event, HoldEnd, Target, WriteOutcome};

use crate::model::{lock, RUNNER};
use crate::scenario::scenario;
use crate::{assert_only, kinds};

/// Appends an entry 10 ns after the last one; returns its index. (Injected writes with
/// the scenario's first token come from worker 4: worker 0 was told that hold was lost,
/// and a write of its after that is a violation of its own.)
fn append(h: &mut Vec<Entry>, worker: u32, event: Event) -> usize {
    let at_ns = h.last().map_or(0, |e| e.at_ns) + 10;
    h.push(Entry {
        at_ns,
        worker,
        event,
    });
    h.len() - 1
}

/// Adds an entry recorded at `at_ns` (the checker orders by time); returns its index.
fn add_at(h: &mut Vec<Entry>, at_ns: u64, worker: u32, event: Event) -> usize {
    h.push(Entry {
        at_ns,
        worker,
        event,
    });
    h.len() - 1
}

fn find(h: &[Entry], what: impl Fn(&Event) -> bool) -> usize {
    h.iter()
        .position(|e| what(&e.event))
        .expect("the scenario has such an entry")
}

fn rfind(h: &[Entry], what: impl Fn(&Event) -> bool) -> usize {
    h.iter()
        .rposition(|e| what(&e.event))
        .expect("the scenario has such an entry")
}

fn granted_tokens(h: &[Entry]) -> Vec<u64> {
    h.iter()
        .filter_map(|e| match &e.event {
            Event::Granted { token, .. } => Some(*token),
            _ => None,
        })
        .collect()
}

fn invoke(resource: &str, token: Option<u64>, op: u64) -> Event {
    Event::WriteInvoked {
        resource: resource.into(),
        target: Target::Postgres,
        token,
        op,
    }
}

fn complete(resource: &str, token: Option<u64>, op: u64, outcome: WriteOutcome) -> Event {
    Event::WriteCompleted {
        resource: resource.into(),
        target: Target::Postgres,
        token,
        op,
        outcome,
    }
}

fn committed(seq: u64) -> WriteOutcome {
    WriteOutcome::Committed { seq }
}

#[test]
fn the_valid_scenario_passes_with_every_count_right() {
    let h = scenario();
    let report = check(&h);
    assert!(report.is_ok(), "{report}");
    let c = &report.counts;
    assert_eq!(c.entries as usize, h.len());
    assert_eq!(c.grants, 9);
    assert_eq!(c.etcd_holds, 9);
    assert_eq!(c.exclusive_holds, 7);
    assert_eq!(c.restored_holds, 1);
    assert_eq!(c.acquire_failures, 1);
    assert_eq!(c.releases, 5);
    assert_eq!(c.release_unknowns, 1);
    assert_eq!(c.losses, 2);
    assert_eq!(c.force_requests, 1);
    assert_eq!(c.forced_holds, 1);
    assert_eq!(c.writes_rejected, 5);
    assert_eq!(c.stale_writes_rejected, 4);
    assert_eq!(c.writes_indeterminate, 4);
    assert_eq!(c.unprotected_writes, 2);
    assert_eq!(
        c.writes,
        c.writes_committed + c.writes_rejected + c.writes_indeterminate
    );
    assert_eq!(c.epoch_advances, 2);
    assert_eq!(c.faults.values().sum::<u64>(), 4);
    // grant rows for every hold, end rows for all but the two open ones (h4, and h6 when
    // the restore destroyed its space), the force release record of h3, unprotected rows.
    assert_eq!(c.audit_rows, 9 + 7 + 1 + 3);
}

#[test]
fn commit_order_two_concurrent_writes_committed_with_decreasing_tokens() {
    let mut h = scenario();
    let tokens = granted_tokens(&h);
    let (low, high) = (tokens[0], tokens[1]);
    let i1 = append(&mut h, 0, invoke("row-z", Some(high), 900));
    let i2 = append(&mut h, 1, invoke("row-z", Some(low), 901));
    let c1 = append(&mut h, 0, complete("row-z", Some(high), 900, committed(1)));
    let c2 = append(&mut h, 1, complete("row-z", Some(low), 901, committed(2)));
    let report = check(&h);
    assert_only(&report, ViolationKind::CommitOrder, &[c1, c2]);
    assert_eq!(report.violations.len(), 1);
    let _ = (i1, i2);
    match &report.violations[0] {
        Violation::CommitOrder { earlier, later, .. } => {
            assert_eq!((earlier.op, later.op), (900, 901));
            assert_eq!((earlier.seq, later.seq), (Some(1), Some(2)));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn commit_order_is_found_when_the_late_entry_is_committed_first() {
    // The write with the lower seq is recorded last: it still lands before the other.
    let mut h = scenario();
    let tokens = granted_tokens(&h);
    let (low, high) = (tokens[0], tokens[1]);
    append(&mut h, 4, invoke("row-z", Some(low), 900));
    append(&mut h, 1, invoke("row-z", Some(high), 901));
    let c_low = append(&mut h, 4, complete("row-z", Some(low), 900, committed(2)));
    let c_high = append(&mut h, 1, complete("row-z", Some(high), 901, committed(1)));
    assert_only(&check(&h), ViolationKind::CommitOrder, &[c_low, c_high]);
}

#[test]
fn seq_reused_two_commits_at_one_sequence_number() {
    let mut h = scenario();
    let t = granted_tokens(&h)[0];
    append(&mut h, 4, invoke("row-z", Some(t), 900));
    append(&mut h, 1, invoke("row-z", Some(t), 901));
    let c1 = append(&mut h, 4, complete("row-z", Some(t), 900, committed(1)));
    let c2 = append(&mut h, 1, complete("row-z", Some(t), 901, committed(1)));
    assert_only(&check(&h), ViolationKind::SeqReused, &[c1, c2]);
}

#[test]
fn commit_before_invocation_a_seq_below_one_completed_earlier() {
    let mut h = scenario();
    let t = granted_tokens(&h)[0];
    append(&mut h, 4, invoke("row-z", Some(t), 900));
    let c1 = append(&mut h, 4, complete("row-z", Some(t), 900, committed(5)));
    let i2 = append(&mut h, 1, invoke("row-z", Some(t), 901));
    let c2 = append(&mut h, 1, complete("row-z", Some(t), 901, committed(3)));
    assert_only(
        &check(&h),
        ViolationKind::CommitBeforeInvocation,
        &[c1, i2, c2],
    );
}

#[test]
fn stale_write_admitted_below_a_mark_set_by_an_indeterminate_write() {
    // The indeterminate write's commit is unknown, so only the resource's refusal, which
    // reported the mark, tells that the later write was stale: rule (b) alone sees it.
    let mut h = scenario();
    let tokens = granted_tokens(&h);
    let (low, mid, high) = (tokens[0], tokens[1], tokens[2]);
    append(&mut h, 0, invoke("row-z", Some(high), 900));
    append(
        &mut h,
        0,
        complete(
            "row-z",
            Some(high),
            900,
            WriteOutcome::Indeterminate {
                reason: "timeout".into(),
            },
        ),
    );
    append(&mut h, 1, invoke("row-z", Some(mid), 901));
    let refusal = append(
        &mut h,
        1,
        complete(
            "row-z",
            Some(mid),
            901,
            WriteOutcome::Rejected {
                highest: Some(high),
            },
        ),
    );
    let i = append(&mut h, 2, invoke("row-z", Some(low), 902));
    let c = append(&mut h, 2, complete("row-z", Some(low), 902, committed(2)));
    assert_only(
        &check(&h),
        ViolationKind::StaleWriteAdmitted,
        &[refusal, i, c],
    );
}

#[test]
fn a_refused_stale_write_turned_into_a_commit_breaks_rules_a_and_b() {
    // In the resource's honest commit order a stale admission is also a decrease.
    let mut h = scenario();
    let rejected = find(
        &h,
        |e| matches!(e, Event::WriteCompleted { resource, outcome: WriteOutcome::Rejected { highest: Some(_) }, .. } if resource == "row-a"),
    );
    let Event::WriteCompleted { outcome, .. } = &mut h[rejected].event else {
        unreachable!()
    };
    // The next write to row-a committed at seq 4 (see the scenario): this one takes 4 and
    // every later row-a commit moves up by one.
    *outcome = committed(4);
    for e in &mut h[rejected + 1..] {
        if let Event::WriteCompleted {
            resource,
            outcome: WriteOutcome::Committed { seq },
            ..
        } = &mut e.event
        {
            if resource == "row-a" {
                *seq += 1;
            }
        }
    }
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        [
            ViolationKind::CommitOrder,
            ViolationKind::StaleWriteAdmitted
        ]
        .into(),
        "{report}"
    );
    assert!(report.violations.iter().all(|v| v
        .entries()
        .contains(&palisade_chaos::check::EntryIndex(rejected))));
}

#[test]
fn unjustified_rejection_of_a_current_token() {
    let mut h = scenario();
    let t = granted_tokens(&h)[0];
    append(&mut h, 4, invoke("row-z", Some(t), 900));
    let c = append(
        &mut h,
        4,
        complete(
            "row-z",
            Some(t),
            900,
            WriteOutcome::Rejected { highest: Some(t) },
        ),
    );
    assert_only(&check(&h), ViolationKind::UnjustifiedRejection, &[c]);
}

#[test]
fn holds_overlap_when_a_shared_hold_is_made_exclusive() {
    let mut h = scenario();
    let second_shared = rfind(&h, |e| {
        matches!(
            e,
            Event::EtcdHold {
                exclusive: false,
                ..
            }
        )
    });
    let first_shared = find(&h, |e| {
        matches!(
            e,
            Event::EtcdHold {
                exclusive: false,
                ..
            }
        )
    });
    let Event::EtcdHold { exclusive, .. } = &mut h[second_shared].event else {
        unreachable!()
    };
    *exclusive = true;
    let report = check(&h);
    assert_only(
        &report,
        ViolationKind::HoldsOverlap,
        &[first_shared, second_shared],
    );
    assert_eq!(report.violations.len(), 1);
}

#[test]
fn holds_overlap_when_an_exclusive_hold_ends_late() {
    // The first holder of lock a ends after the second was granted; its end row moves with
    // it so that the audit still matches.
    let mut h = scenario();
    let first = find(
        &h,
        |e| matches!(e, Event::EtcdHold { lock, .. } if lock.key == "a"),
    );
    let Event::EtcdHold { end_rev, .. } = &mut h[first].event else {
        unreachable!()
    };
    let late = end_rev.unwrap() + 3;
    *end_rev = Some(late);
    let row = find(
        &h,
        |e| matches!(e, Event::AuditRow { kind, .. } if kind == "expire"),
    );
    let Event::AuditRow { revision, .. } = &mut h[row].event else {
        unreachable!()
    };
    *revision = Some(late);
    let second = find(
        &h[first + 1..],
        |e| matches!(e, Event::EtcdHold { lock, .. } if lock.key == "a"),
    ) + first
        + 1;
    assert_only(&check(&h), ViolationKind::HoldsOverlap, &[first, second]);
}

#[test]
fn epoch_not_increasing() {
    let mut h = scenario();
    let last = rfind(&h, |e| matches!(e, Event::EpochAdvanced { .. }));
    let again = {
        let e = h[last].event.clone();
        append(&mut h, RUNNER, e)
    };
    assert_only(
        &check(&h),
        ViolationKind::EpochNotIncreasing,
        &[last, again],
    );
}

#[test]
fn token_from_old_epoch_granted_after_the_advance() {
    let mut h = scenario();
    let advance = rfind(&h, |e| matches!(e, Event::EpochAdvanced { .. }));
    let at = h[advance].at_ns;
    // A grant from epoch 1 above every epoch-1 token so far: only its epoch is wrong.
    let old = granted_tokens(&h)
        .into_iter()
        .filter(|t| t >> 48 == 1)
        .max()
        .unwrap()
        + 50;
    let a = lock("zz");
    let acquire = add_at(&mut h, at + 1, 7, Event::AcquireInvoked { lock: a.clone() });
    let grant_rev = (old & 0xffff_ffff_ffff) as i64;
    let grant = add_at(
        &mut h,
        at + 2,
        7,
        Event::Granted {
            lock: a,
            token: old,
            session: 77,
            grant_rev,
            tier: None,
        },
    );
    assert_only(
        &check(&h),
        ViolationKind::TokenFromOldEpoch,
        &[advance, acquire, grant],
    );
}

#[test]
fn token_not_increasing_after_an_earlier_grant() {
    let mut h = scenario();
    let last = rfind(&h, |e| matches!(e, Event::Granted { .. }));
    let Event::Granted { token, .. } = h[last].event else {
        unreachable!()
    };
    let a = lock("zz");
    let acquire = append(&mut h, 7, Event::AcquireInvoked { lock: a.clone() });
    let stale = token - 1;
    let grant_rev = (stale & 0xffff_ffff_ffff) as i64;
    let grant = append(
        &mut h,
        7,
        Event::Granted {
            lock: a,
            token: stale,
            session: 77,
            grant_rev,
            tier: None,
        },
    );
    assert_only(
        &check(&h),
        ViolationKind::TokenNotIncreasing,
        &[last, acquire, grant],
    );
}

#[test]
fn token_not_from_grant_revision() {
    let mut h = scenario();
    let grant = find(&h, |e| matches!(e, Event::Granted { .. }));
    let Event::Granted { grant_rev, .. } = &mut h[grant].event else {
        unreachable!()
    };
    *grant_rev += 1;
    assert_only(&check(&h), ViolationKind::TokenNotFromGrant, &[grant]);
}

#[test]
fn audit_missing_a_grant_row() {
    let mut h = scenario();
    let row = find(
        &h,
        |e| matches!(e, Event::AuditRow { kind, .. } if kind == "grant"),
    );
    let Event::AuditRow { token, .. } = h[row].event.clone() else {
        unreachable!()
    };
    h.remove(row);
    let hold = find(
        &h,
        |e| matches!(e, Event::EtcdHold { grant_rev, .. } if Some(*grant_rev as u64) == token.map(|t| t & 0xffff_ffff_ffff)),
    );
    assert_only(&check(&h), ViolationKind::AuditMissing, &[hold]);
}

#[test]
fn audit_missing_an_unprotected_write() {
    let mut h = scenario();
    // Two committed writes to /legacy/report need two rows; one is left.
    for _ in 0..2 {
        let row = find(
            &h,
            |e| matches!(e, Event::AuditRow { kind, .. } if kind == "unprotected_write"),
        );
        h.remove(row);
    }
    let report = check(&h);
    assert_only(&report, ViolationKind::AuditMissing, &[]);
    assert!(
        report
            .to_string()
            .contains("unprotected write to /legacy/report"),
        "{report}"
    );
}

#[test]
fn audit_duplicate_of_an_expiry() {
    let mut h = scenario();
    let row = find(
        &h,
        |e| matches!(e, Event::AuditRow { kind, .. } if kind == "expire"),
    );
    let copy = {
        let e = h[row].event.clone();
        append(&mut h, RUNNER, e)
    };
    assert_only(&check(&h), ViolationKind::AuditDuplicate, &[row, copy]);
}

#[test]
fn audit_of_unprotected_writes_allows_a_row_for_an_indeterminate_write_not_more() {
    // /legacy/report: two committed writes and one indeterminate: two or three rows (the
    // model applied the indeterminate write, so it wrote three).
    let mut h = scenario();
    let rows = |h: &[Entry]| -> Vec<usize> {
        (0..h.len())
            .filter(|&i| matches!(&h[i].event, Event::AuditRow { resource: Some(r), .. } if r == "/legacy/report"))
            .collect()
    };
    assert_eq!(rows(&h).len(), 3);
    let mut fewer = h.clone();
    fewer.remove(rows(&h)[2]);
    let report = check(&fewer);
    assert!(
        report.is_ok(),
        "the indeterminate write may not have landed: {report}"
    );
    fewer.remove(rows(&h)[1]);
    assert_only(&check(&fewer), ViolationKind::AuditMissing, &[]);
    let first = rows(&h)[0];
    let extra = {
        let e = h[first].event.clone();
        append(&mut h, RUNNER, e)
    };
    assert_only(&check(&h), ViolationKind::AuditDuplicate, &[first, extra]);
}

#[test]
fn audit_unexpected_release_of_a_hold_that_is_still_open() {
    let mut h = scenario();
    let open = rfind(&h, |e| matches!(e, Event::EtcdHold { end_rev: None, .. }));
    let Event::EtcdHold {
        lock,
        epoch,
        grant_rev,
        ..
    } = h[open].event.clone()
    else {
        unreachable!()
    };
    let token = (u64::from(epoch) << 48) | grant_rev as u64;
    let event = Event::AuditRow {
        kind: "release".into(),
        lock: Some(lock),
        resource: None,
        token: Some(token),
        revision: None,
    };
    let row = append(&mut h, RUNNER, event);
    assert_only(&check(&h), ViolationKind::AuditUnexpected, &[row]);
}

#[test]
fn audit_unexpected_row_without_a_token_at_an_unknown_revision() {
    let mut h = scenario();
    let event = Event::AuditRow {
        kind: "grant".into(),
        lock: Some(lock("a")),
        resource: None,
        token: None,
        revision: Some(5),
    };
    let row = append(&mut h, RUNNER, event);
    assert_only(&check(&h), ViolationKind::AuditUnexpected, &[row]);
}

#[test]
fn completion_without_invocation() {
    let mut h = scenario();
    let completed = find(&h, |e| {
        matches!(
            e,
            Event::WriteCompleted {
                outcome: WriteOutcome::Rejected { .. },
                ..
            }
        )
    });
    let Event::WriteCompleted { op, .. } = h[completed].event else {
        unreachable!()
    };
    let invoked = find(
        &h,
        |e| matches!(e, Event::WriteInvoked { op: o, .. } if *o == op),
    );
    h.remove(invoked);
    assert_only(
        &check(&h),
        ViolationKind::CompletionWithoutInvocation,
        &[completed - 1],
    );
}

#[test]
fn completion_differs_from_its_invocation() {
    let mut h = scenario();
    let completed = find(&h, |e| {
        matches!(
            e,
            Event::WriteCompleted {
                outcome: WriteOutcome::Rejected { .. },
                ..
            }
        )
    });
    let Event::WriteCompleted { resource, op, .. } = &mut h[completed].event else {
        unreachable!()
    };
    *resource = "elsewhere".into();
    let op = *op;
    let invoked = find(
        &h,
        |e| matches!(e, Event::WriteInvoked { op: o, .. } if *o == op),
    );
    assert_only(
        &check(&h),
        ViolationKind::CompletionDiffers,
        &[invoked, completed],
    );
}

#[test]
fn op_reused_while_in_flight() {
    let mut h = scenario();
    let t = granted_tokens(&h)[0];
    let first = append(&mut h, 4, invoke("row-z", Some(t), 900));
    let second = append(&mut h, 1, invoke("row-z", Some(t), 900));
    append(
        &mut h,
        1,
        complete(
            "row-z",
            Some(t),
            900,
            WriteOutcome::Indeterminate { reason: "x".into() },
        ),
    );
    assert_only(&check(&h), ViolationKind::OpReused, &[first, second]);
}

#[test]
fn unknown_token_never_granted() {
    let mut h = scenario();
    let forged = (1 << 48) + 99_999;
    let i = append(&mut h, 0, invoke("row-z", Some(forged), 900));
    append(
        &mut h,
        0,
        complete(
            "row-z",
            Some(forged),
            900,
            WriteOutcome::Rejected { highest: None },
        ),
    );
    assert_only(&check(&h), ViolationKind::UnknownToken, &[i]);
}

#[test]
fn grant_without_acquire() {
    let mut h = scenario();
    let grant = rfind(&h, |e| matches!(e, Event::Granted { .. }));
    let acquire = (0..grant)
        .rev()
        .find(|&i| matches!(h[i].event, Event::AcquireInvoked { .. }))
        .unwrap();
    h.remove(acquire);
    assert_only(&check(&h), ViolationKind::GrantWithoutAcquire, &[grant - 1]);
}

#[test]
fn malformed_entry_a_gap_row() {
    let mut h = scenario();
    let event = Event::AuditRow {
        kind: "gap".into(),
        lock: None,
        resource: None,
        token: None,
        revision: Some(7),
    };
    let row = append(&mut h, RUNNER, event);
    let report = check(&h);
    assert_only(&report, ViolationKind::MalformedEntry, &[row]);
    assert!(
        report.to_string().contains("unknown kind \"gap\""),
        "{report}"
    );
}

#[test]
fn malformed_entry_an_open_hold_with_an_end_revision() {
    let mut h = scenario();
    let open = rfind(&h, |e| matches!(e, Event::EtcdHold { end_rev: None, .. }));
    let Event::EtcdHold {
        end_rev, grant_rev, ..
    } = &mut h[open].event
    else {
        unreachable!()
    };
    *end_rev = Some(*grant_rev + 10);
    assert_only(&check(&h), ViolationKind::MalformedEntry, &[open]);
}

/// The scenario's restored hold (worker 2's hold of lock b, brought back by the restore).
fn restored_hold(h: &[Entry]) -> usize {
    find(h, |e| matches!(e, Event::RestoredHold { .. }))
}

#[test]
fn restored_hold_overlap_when_a_new_epoch_hold_is_granted_while_it_is_present() {
    // The restored hold of b ends after worker 1's hold of b was granted in the restored
    // cluster: two exclusive holds of one lock at once in the space's revision order.
    let mut h = scenario();
    let restored = restored_hold(&h);
    let Event::RestoredHold { space, .. } = h[restored].event.clone() else {
        unreachable!()
    };
    let next = find(
        &h,
        |e| matches!(e, Event::EtcdHold { lock, space: s, .. } if lock.key == "b" && *s == space),
    );
    let Event::EtcdHold { grant_rev, .. } = h[next].event else {
        unreachable!()
    };
    let Event::RestoredHold { end_rev, .. } = &mut h[restored].event else {
        unreachable!()
    };
    *end_rev = Some(grant_rev + 1);
    let report = check(&h);
    assert_only(
        &report,
        ViolationKind::RestoredHoldOverlap,
        &[restored, next],
    );
    assert_eq!(report.violations.len(), 1, "{report}");
}

#[test]
fn restored_hold_overlap_when_it_never_ends() {
    let mut h = scenario();
    let restored = restored_hold(&h);
    let Event::RestoredHold { end_rev, end, .. } = &mut h[restored].event else {
        unreachable!()
    };
    *end_rev = None;
    *end = HoldEnd::Open;
    let next = find(
        &h,
        |e| matches!(e, Event::EtcdHold { lock, space: 1, .. } if lock.key == "b"),
    );
    assert_only(
        &check(&h),
        ViolationKind::RestoredHoldOverlap,
        &[restored, next],
    );
}

#[test]
fn restored_hold_overlap_of_two_restored_exclusive_holds() {
    let mut h = scenario();
    let restored = restored_hold(&h);
    let Event::RestoredHold {
        epoch,
        grant_rev,
        restored_rev,
        space,
        end_rev,
        ..
    } = h[restored].event.clone()
    else {
        unreachable!()
    };
    // Another exclusive hold of b in the snapshot (its own grant is listed from space 0).
    let other = Event::RestoredHold {
        lock: lock("b"),
        epoch,
        grant_rev: grant_rev - 1,
        restored_rev,
        space,
        end_rev,
        exclusive: true,
        end: HoldEnd::Expired,
    };
    let second = append(&mut h, RUNNER, other);
    let report = check(&h);
    assert_only(
        &report,
        ViolationKind::RestoredHoldOverlap,
        &[restored, second],
    );
}

#[test]
fn restored_hold_not_older_than_the_holds_granted_after_the_restore() {
    // The restored hold claims the epoch the restored cluster grants in: the epoch was
    // not advanced past it.
    let mut h = scenario();
    let restored = restored_hold(&h);
    let new_epoch = h
        .iter()
        .filter_map(|e| match e.event {
            Event::EpochAdvanced { epoch, .. } => Some(epoch),
            _ => None,
        })
        .max()
        .unwrap();
    let Event::RestoredHold { epoch, .. } = &mut h[restored].event else {
        unreachable!()
    };
    *epoch = new_epoch;
    let granted: Vec<usize> = (0..h.len())
        .filter(|&i| matches!(h[i].event, Event::EtcdHold { space: 1, .. }))
        .collect();
    assert_eq!(granted.len(), 2, "h4 and h5 are granted after the restore");
    let mut named = granted.clone();
    named.push(restored);
    let report = check(&h);
    assert_only(&report, ViolationKind::RestoredHoldNotOlder, &named);
    assert_eq!(report.violations.len(), 2, "{report}");
}

#[test]
fn a_restored_token_admitted_after_a_newer_epoch_token_is_a_stale_write() {
    // Worker 2's restored hold ended and worker 1 wrote row-b with a newer-epoch token;
    // worker 2's next write with the restored token is committed instead of refused.
    let mut h = scenario();
    let Event::RestoredHold {
        epoch, grant_rev, ..
    } = h[restored_hold(&h)].event.clone()
    else {
        unreachable!()
    };
    let old = (u64::from(epoch) << 48) | grant_rev as u64;
    let last_seq = h
        .iter()
        .filter_map(|e| match &e.event {
            Event::WriteCompleted {
                resource,
                outcome: WriteOutcome::Committed { seq },
                ..
            } if resource == "row-b" => Some(*seq),
            _ => None,
        })
        .max()
        .unwrap();
    let at = h
        .iter()
        .rposition(
            |e| matches!(&e.event, Event::WriteCompleted { resource, .. } if resource == "row-b"),
        )
        .unwrap();
    let t = h[at].at_ns;
    let invoked = add_at(&mut h, t + 1, 2, invoke("row-b", Some(old), 950));
    let committed_at = add_at(
        &mut h,
        t + 2,
        2,
        complete("row-b", Some(old), 950, committed(last_seq + 1)),
    );
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        [
            ViolationKind::CommitOrder,
            ViolationKind::StaleWriteAdmitted
        ]
        .into(),
        "{report}"
    );
    let stale = report
        .violations
        .iter()
        .find(|v| v.kind() == ViolationKind::StaleWriteAdmitted)
        .unwrap();
    assert!(
        stale
            .entries()
            .contains(&palisade_chaos::check::EntryIndex(invoked)),
        "{report}"
    );
    assert!(
        stale
            .entries()
            .contains(&palisade_chaos::check::EntryIndex(committed_at)),
        "{report}"
    );
}

#[test]
fn malformed_entry_a_restored_hold_granted_after_its_snapshot() {
    let mut h = scenario();
    let restored = restored_hold(&h);
    let Event::RestoredHold {
        grant_rev,
        restored_rev,
        ..
    } = &mut h[restored].event
    else {
        unreachable!()
    };
    *grant_rev = *restored_rev + 1;
    let report = check(&h);
    assert_only(&report, ViolationKind::MalformedEntry, &[restored]);
    assert!(
        report
            .to_string()
            .contains("granted above the revision of the snapshot"),
        "{report}"
    );
}

#[test]
fn audit_rows_above_the_cut_of_a_destroyed_space_may_be_missing_not_below() {
    // The forced release of h3 is the last event of space 0. With the tailer's cut just
    // below it, its row may be missing (counted as lost); with the cut at it, it must be
    // there.
    let mut h = scenario();
    let row = find(
        &h,
        |e| matches!(e, Event::AuditRow { kind, .. } if kind == "force"),
    );
    let Event::AuditRow {
        revision: Some(rev),
        ..
    } = h[row].event
    else {
        unreachable!()
    };
    let cut = find(&h, |e| matches!(e, Event::AuditCut { space: 0, .. }));
    let Event::AuditCut { through, .. } = &mut h[cut].event else {
        unreachable!()
    };
    assert_eq!(
        *through, rev,
        "the scenario's tailer read space 0 to its end"
    );
    *through = rev - 1;
    let mut lost = h.clone();
    lost.remove(row);
    let report = check(&lost);
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.counts.audit_lost_with_cluster, 1);
    // With the row there, nothing is lost.
    assert_eq!(check(&h).counts.audit_lost_with_cluster, 0);
    assert!(check(&h).is_ok());
    // The cut back at the force's revision: the missing row is a violation.
    let Event::AuditCut { through, .. } = &mut lost[cut].event else {
        unreachable!()
    };
    *through = rev;
    let hold = find(&lost, |e| {
        matches!(
            e,
            Event::EtcdHold {
                end: HoldEnd::Forced,
                ..
            }
        )
    });
    assert_only(&check(&lost), ViolationKind::AuditMissing, &[hold]);
}

/// A hold granted in the restored space under the epoch the restore brought back, named
/// by session 0x5e (appended after the restored cluster's other holds).
fn refused_hold(h: &mut Vec<Entry>) -> (usize, u64) {
    let restored = restored_hold(h);
    let Event::RestoredHold { epoch, space, .. } = h[restored].event.clone() else {
        unreachable!()
    };
    let last_rev = h
        .iter()
        .filter_map(|e| match e.event {
            Event::EtcdHold {
                space: s,
                grant_rev,
                end_rev,
                ..
            } if s == space => Some(end_rev.unwrap_or(grant_rev)),
            _ => None,
        })
        .max()
        .unwrap();
    let grant_rev = last_rev + 10;
    let event = Event::EtcdHold {
        lock: lock("a"),
        epoch,
        grant_rev,
        end_rev: Some(grant_rev + 2),
        exclusive: true,
        end: HoldEnd::Released,
        space,
        session: Some(0x5e),
        tier: None,
    };
    let index = append(h, RUNNER, event);
    (index, (u64::from(epoch) << 48) | grant_rev as u64)
}

#[test]
fn restored_space_hold_of_the_old_epoch_that_no_worker_was_handed_is_not_older_epoch() {
    // A locker's grant Txn applied in the restored cluster before the locker saw its new
    // cluster id: refused and deleted, no token minted. Only exclusion applies to it.
    let mut h = scenario();
    refused_hold(&mut h);
    let report = check(&h);
    assert!(
        !kinds(&report).contains(&ViolationKind::RestoredHoldNotOlder),
        "{report}"
    );
}

#[test]
fn restored_space_hold_of_the_old_epoch_handed_to_a_worker_is_older_epoch() {
    let mut h = scenario();
    let (refused, token) = refused_hold(&mut h);
    let Event::EtcdHold { grant_rev, .. } = h[refused].event else {
        unreachable!()
    };
    // The same hold, handed out: a worker recorded it granted (after invoking).
    let invoked = Event::AcquireInvoked { lock: lock("a") };
    let at = h[refused].at_ns - 5;
    add_at(&mut h, at - 1, 7, invoked);
    add_at(
        &mut h,
        at,
        7,
        Event::Granted {
            lock: lock("a"),
            token,
            session: 0x5e,
            grant_rev,
            tier: None,
        },
    );
    h.sort_by_key(|e| e.at_ns);
    let refused = find(&h, |e| {
        matches!(
            e,
            Event::EtcdHold {
                session: Some(0x5e),
                ..
            }
        )
    });
    let report = check(&h);
    let restored = restored_hold(&h);
    assert!(
        report.violations.iter().any(
            |v| matches!(v, Violation::RestoredHoldNotOlder { hold, restored: r, .. }
            if hold.entry.0 == refused && r.entry.0 == restored)
        ),
        "{report}"
    );
}

#[test]
fn holds_of_one_epoch_in_two_revision_spaces_are_not_compared_by_revision() {
    // The restored cluster numbers its revisions again from the snapshot's: a hold it
    // granted (and a locker refused) before the epoch advance can have the epoch and
    // the very revisions of a hold of the first space.
    let mut h = scenario();
    let first = find(&h, |e| {
        matches!(
            e,
            Event::EtcdHold {
                space: 0,
                exclusive: true,
                end_rev: Some(_),
                ..
            }
        )
    });
    let Event::EtcdHold {
        lock,
        epoch,
        grant_rev,
        end_rev,
        ..
    } = h[first].event.clone()
    else {
        unreachable!()
    };
    let twin = |space| Event::EtcdHold {
        lock: lock.clone(),
        epoch,
        grant_rev,
        end_rev,
        exclusive: true,
        end: HoldEnd::Released,
        space,
        session: Some(0x5e),
        tier: None,
    };
    let mut other_space = h.clone();
    append(&mut other_space, RUNNER, twin(1));
    let report = check(&other_space);
    assert!(
        !kinds(&report).contains(&ViolationKind::HoldsOverlap),
        "{report}"
    );
    // The same hold in the first hold's own space overlaps it.
    let second = append(&mut h, RUNNER, twin(0));
    let report = check(&h);
    assert!(
        report.violations.iter().any(
            |v| matches!(v, Violation::HoldsOverlap { first: a, second: b, .. }
            if a.entry.0 == first && b.entry.0 == second)
        ),
        "{report}"
    );
}
