//! The streaming reader: same answers as the in-memory checker, entries a little out of
//! time order are fine, entries far out of order are reported.

use std::time::Duration;

use palisade_chaos::check::{check, check_reader, check_reader_with, ViolationKind};
use palisade_chaos::history::{
    write_entry, Entry, Event, FaultKind, Phase, ReadError, Target, WriteOutcome,
};

use crate::assert_only;
use crate::model::{random_history, RUNNER};
use crate::scenario::scenario;

fn to_lines(h: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in h {
        write_entry(&mut out, e).unwrap();
    }
    out
}

#[test]
fn the_reader_agrees_with_the_in_memory_checker() {
    for h in [scenario(), random_history(7, 4, 3, 2_000)] {
        let from_memory = check(&h);
        let streamed = check_reader(&to_lines(&h)[..]).unwrap();
        assert!(streamed.is_ok(), "{streamed}");
        assert_eq!(streamed, from_memory);
    }
}

#[test]
fn entries_written_out_of_time_order_within_the_window_are_fine_and_named_by_position() {
    // Concurrent recorders: each pair of neighbours is written in the wrong order.
    let mut h = random_history(11, 4, 3, 2_000);
    for pair in h.chunks_mut(2) {
        pair.reverse();
    }
    assert!(check_reader(&to_lines(&h)[..]).unwrap().is_ok());
    // An injected violation is named by its position in the file.
    let committed = h
        .iter()
        .position(|e| {
            matches!(
                e.event,
                Event::WriteCompleted {
                    outcome: WriteOutcome::Committed { .. },
                    token: Some(_),
                    ..
                }
            )
        })
        .unwrap();
    let Event::WriteCompleted {
        resource, token, ..
    } = h[committed].event.clone()
    else {
        unreachable!()
    };
    let at = h.last().unwrap().at_ns;
    let invoke = Event::WriteInvoked {
        resource: resource.clone(),
        target: Target::Postgres,
        token,
        op: 1 << 40,
    };
    let complete = Event::WriteCompleted {
        resource,
        target: Target::Postgres,
        token,
        op: 1 << 40,
        outcome: WriteOutcome::Rejected { highest: token },
    };
    // Written completion first, invocation second, both within the window.
    h.push(Entry {
        at_ns: at + 20,
        worker: 0,
        event: complete,
    });
    h.push(Entry {
        at_ns: at + 10,
        worker: 0,
        event: invoke,
    });
    let report = check_reader(&to_lines(&h)[..]).unwrap();
    assert_only(&report, ViolationKind::UnjustifiedRejection, &[h.len() - 2]);
}

#[test]
fn an_entry_older_than_the_window_is_reported_out_of_order() {
    let mut h = scenario();
    let last = h.last().unwrap().at_ns;
    let fault = |at_ns| Entry {
        at_ns,
        worker: RUNNER,
        event: Event::Fault {
            kind: FaultKind::PauseEtcdMember,
            phase: Phase::Start,
            detail: "m1".into(),
            paused_worker: None,
        },
    };
    h.push(fault(last + 20_000_000_000));
    h.push(fault(5));
    let report = check_reader(&to_lines(&h)[..]).unwrap();
    assert_only(&report, ViolationKind::OutOfOrder, &[h.len() - 1]);
    // With no window at all, a single swapped pair is already out of order.
    let mut h = scenario();
    let n = h.len();
    h.swap(n - 1, n - 2);
    let report = check_reader_with(&to_lines(&h)[..], Duration::ZERO).unwrap();
    assert_only(&report, ViolationKind::OutOfOrder, &[n - 1]);
    // The in-memory checker sorts, so order does not matter to it.
    assert!(check(&h).is_ok());
}

#[test]
fn a_history_that_cannot_be_read_is_an_error_naming_the_line() {
    let mut lines = to_lines(&scenario());
    lines.extend_from_slice(b"{\"at_ns\": 1, \"worker\": 0, \"type\": \"no_such_event\"}\n");
    let n = scenario().len() + 1;
    match check_reader(&lines[..]) {
        Err(ReadError::Parse { line, .. }) => assert_eq!(line, n),
        other => panic!("expected a parse error on line {n}, got {other:?}"),
    }
}
