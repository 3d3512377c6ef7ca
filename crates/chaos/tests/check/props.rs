//! Property tests: every history of the sequential model passes; every mutation that
//! breaks a rule fails.

use std::collections::HashMap;

use palisade_chaos::check::{check, ViolationKind};
use palisade_chaos::history::{Entry, Event, HoldEnd, WriteOutcome};
use proptest::prelude::*;

use crate::model::random_history;

fn history() -> impl Strategy<Value = Vec<Entry>> {
    (any::<u64>(), 1u32..6, 1usize..5, 100usize..800)
        .prop_map(|(seed, w, l, s)| random_history(seed, w, l, s))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_history_of_the_model_passes(h in history()) {
        let report = check(&h);
        prop_assert!(report.is_ok(), "{}", report);
        let restored = h.iter().filter(|e| matches!(e.event, Event::RestoredHold { .. })).count();
        prop_assert_eq!(report.counts.restored_holds, restored as u64);
        let c = &report.counts;
        prop_assert_eq!(c.writes, c.writes_committed + c.writes_rejected + c.writes_indeterminate);
    }

    #[test]
    fn every_mutation_fails(h in history(), which in 0usize..7, pick in any::<prop::sample::Index>()) {
        let mut h = h;
        let expected = mutate(&mut h, which, pick);
        prop_assume!(expected.is_some());
        let expected = expected.unwrap();
        let report = check(&h);
        let found: Vec<_> = report.violations.iter().map(|v| v.kind()).collect();
        prop_assert!(
            expected.iter().any(|k| found.contains(k)),
            "mutation {} expected one of {:?}, found {:?}", which, expected, found
        );
    }
}

/// Breaks a rule in one place; returns the kinds of which at least one must be reported,
/// or `None` if the history has nothing to break this way.
fn mutate(
    h: &mut Vec<Entry>,
    which: usize,
    pick: prop::sample::Index,
) -> Option<Vec<ViolationKind>> {
    match which {
        // A refused write whose mark came from a write committed before it was invoked
        // is committed instead, at the next seq.
        0 => {
            let mut committed_at: HashMap<(String, u64), usize> = HashMap::new();
            let mut invoked_at: HashMap<u64, usize> = HashMap::new();
            let mut candidates = Vec::new();
            for (i, e) in h.iter().enumerate() {
                match &e.event {
                    Event::WriteInvoked { op, .. } => {
                        invoked_at.insert(*op, i);
                    }
                    Event::WriteCompleted {
                        resource,
                        token: Some(t),
                        outcome: WriteOutcome::Committed { .. },
                        ..
                    } => {
                        committed_at.entry((resource.clone(), *t)).or_insert(i);
                    }
                    Event::WriteCompleted {
                        resource,
                        op,
                        outcome: WriteOutcome::Rejected { highest: Some(m) },
                        ..
                    } if committed_at
                        .get(&(resource.clone(), *m))
                        .is_some_and(|&c| c < invoked_at[op]) =>
                    {
                        candidates.push(i);
                    }
                    _ => {}
                }
            }
            if candidates.is_empty() {
                return None;
            }
            let i = *pick.get(&candidates);
            let Event::WriteCompleted {
                resource, target, ..
            } = h[i].event.clone()
            else {
                unreachable!()
            };
            let same = |e: &Event| matches!(e, Event::WriteCompleted { resource: r, target: t, .. } if *r == resource && *t == target);
            let before = h[..i]
                .iter()
                .filter_map(|e| match &e.event {
                    Event::WriteCompleted {
                        outcome: WriteOutcome::Committed { seq },
                        ..
                    } if same(&e.event) => Some(*seq),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            if let Event::WriteCompleted { outcome, .. } = &mut h[i].event {
                *outcome = WriteOutcome::Committed { seq: before + 1 };
            }
            for e in &mut h[i + 1..] {
                if same(&e.event) {
                    if let Event::WriteCompleted {
                        outcome: WriteOutcome::Committed { seq },
                        ..
                    } = &mut e.event
                    {
                        *seq += 1;
                    }
                }
            }
            Some(vec![ViolationKind::StaleWriteAdmitted])
        }
        // A lock audit row is lost.
        1 => {
            let rows = lock_rows(h);
            if rows.is_empty() {
                return None;
            }
            let i = *pick.get(&rows);
            h.remove(i);
            Some(vec![ViolationKind::AuditMissing])
        }
        // A lock audit row is stored twice.
        2 => {
            let rows = lock_rows(h);
            if rows.is_empty() {
                return None;
            }
            let i = *pick.get(&rows);
            let mut copy = h[i].clone();
            copy.at_ns = h.last().unwrap().at_ns + 1;
            h.push(copy);
            Some(vec![ViolationKind::AuditDuplicate])
        }
        // A grant carries the token of the grant before it.
        3 => {
            let grants: Vec<usize> = h
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e.event, Event::Granted { .. }))
                .map(|(i, _)| i)
                .collect();
            if grants.len() < 2 {
                return None;
            }
            let k = 1 + pick.index(grants.len() - 1);
            let Event::Granted {
                token: previous,
                grant_rev: previous_rev,
                ..
            } = h[grants[k - 1]].event
            else {
                unreachable!()
            };
            if let Event::Granted {
                token, grant_rev, ..
            } = &mut h[grants[k]].event
            {
                *token = previous;
                *grant_rev = previous_rev;
            }
            Some(vec![ViolationKind::TokenNotIncreasing])
        }
        // A committed write takes the seq of an earlier commit to the same resource.
        4 => {
            let mut first: HashMap<(String, bool), u64> = HashMap::new();
            let mut candidates = Vec::new();
            for (i, e) in h.iter().enumerate() {
                if let Event::WriteCompleted {
                    resource,
                    target,
                    outcome: WriteOutcome::Committed { seq },
                    ..
                } = &e.event
                {
                    let key = (
                        resource.clone(),
                        *target == palisade_chaos::history::Target::Http,
                    );
                    match first.get(&key) {
                        Some(s) => candidates.push((i, *s)),
                        None => {
                            first.insert(key, *seq);
                        }
                    }
                }
            }
            if candidates.is_empty() {
                return None;
            }
            let (i, s) = *pick.get(&candidates);
            if let Event::WriteCompleted {
                outcome: WriteOutcome::Committed { seq },
                ..
            } = &mut h[i].event
            {
                *seq = s;
            }
            Some(vec![
                ViolationKind::SeqReused,
                ViolationKind::CommitBeforeInvocation,
            ])
        }
        // A restored hold lasts past the grant of its lock that followed it in its space.
        6 => {
            let mut candidates = Vec::new();
            for (i, e) in h.iter().enumerate() {
                let Event::RestoredHold {
                    lock,
                    space,
                    exclusive,
                    ..
                } = &e.event
                else {
                    continue;
                };
                let next = h.iter().filter_map(|n| match &n.event {
                    Event::EtcdHold {
                        lock: l,
                        space: s,
                        grant_rev,
                        exclusive: x,
                        ..
                    } if l == lock && s == space && (*x || *exclusive) => Some(*grant_rev),
                    _ => None,
                });
                if let Some(rev) = next.min() {
                    candidates.push((i, rev));
                }
            }
            if candidates.is_empty() {
                return None;
            }
            let (i, rev) = *pick.get(&candidates);
            if let Event::RestoredHold { end_rev, end, .. } = &mut h[i].event {
                *end_rev = Some(rev + 1);
                if *end == HoldEnd::Open {
                    *end = HoldEnd::Expired;
                }
            }
            Some(vec![ViolationKind::RestoredHoldOverlap])
        }
        // A grant loses its acquire.
        _ => {
            let acquires: Vec<usize> = h
                .iter()
                .enumerate()
                .filter(|(i, e)| {
                    matches!(e.event, Event::AcquireInvoked { .. })
                        && matches!(h.get(i + 1).map(|n| &n.event), Some(Event::Granted { .. }))
                })
                .map(|(i, _)| i)
                .collect();
            if acquires.is_empty() {
                return None;
            }
            h.remove(*pick.get(&acquires));
            Some(vec![ViolationKind::GrantWithoutAcquire])
        }
    }
}

fn lock_rows(h: &[Entry]) -> Vec<usize> {
    h.iter()
        .enumerate()
        .filter(|(_, e)| matches!(&e.event, Event::AuditRow { lock: Some(_), .. }))
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn the_model_brings_holds_back_with_its_restores() {
    // The property tests above see restored holds: some histories hold locks across a
    // restore, in the snapshot, and those come back.
    let mut restored = 0;
    for seed in 0..40 {
        let h = random_history(seed, 4, 3, 800);
        let report = check(&h);
        assert!(report.is_ok(), "seed {seed}: {report}");
        restored += report.counts.restored_holds;
    }
    assert!(
        restored >= 5,
        "only {restored} restored holds in 40 histories"
    );
}
