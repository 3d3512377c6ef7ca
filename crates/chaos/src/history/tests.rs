use super::*;

#[test]
fn an_entry_round_trips_through_one_json_line() {
    let entry = Entry {
        at_ns: 12,
        worker: 3,
        event: Event::WriteCompleted {
            resource: "row-1".into(),
            target: Target::Postgres,
            token: Some((1 << 48) + 7),
            op: 9,
            outcome: WriteOutcome::Rejected {
                highest: Some((1 << 48) + 9),
            },
        },
    };
    let mut buf = Vec::new();
    write_entry(&mut buf, &entry).unwrap();
    let text = String::from_utf8(buf.clone()).unwrap();
    assert_eq!(text.matches('\n').count(), 1);
    assert!(text.contains(r#""type":"write_completed""#), "{text}");
    assert!(text.contains(r#""outcome":"rejected""#), "{text}");
    assert_eq!(read_history(&buf[..]).unwrap(), vec![entry]);
    // A fault naming the worker it pauses keeps the recorder's `worker` apart.
    let fault = Entry {
        at_ns: 13,
        worker: u32::MAX,
        event: Event::Fault {
            kind: FaultKind::PauseWorker,
            phase: Phase::Start,
            detail: "worker 2".into(),
            paused_worker: Some(2),
        },
    };
    let mut buf = Vec::new();
    write_entry(&mut buf, &fault).unwrap();
    assert_eq!(read_history(&buf[..]).unwrap(), vec![fault]);
}

#[test]
fn a_bad_line_names_its_number() {
    let text = "\n{\"at_ns\":1,\"worker\":0,\"type\":\"epoch_advanced\",\"epoch\":2}\nnot json\n";
    match read_history(text.as_bytes()) {
        Err(ReadError::Parse { line, .. }) => assert_eq!(line, 3),
        other => panic!("expected a parse error on line 3, got {other:?}"),
    }
}

#[test]
fn entries_stream_with_line_numbers() {
    let text =
        "{\"at_ns\":1,\"worker\":0,\"type\":\"epoch_advanced\",\"epoch\":2}\n\n{\"at_ns\":2}\n";
    let mut read = entries(text.as_bytes());
    assert!(matches!(read.next(), Some(Ok(Entry { at_ns: 1, .. }))));
    assert!(matches!(
        read.next(),
        Some(Err(ReadError::Parse { line: 3, .. }))
    ));
    assert!(read.next().is_none());
}
