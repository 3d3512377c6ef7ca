use super::*;

fn change(revision: i64, delete: bool, key: &str, value: &str, create: i64) -> Change {
    Change {
        revision,
        delete,
        key: key.into(),
        value: value.as_bytes().to_vec(),
        version: if delete { 0 } else { 1 },
        create_revision: if delete { 0 } else { create },
    }
}

#[test]
fn releases_expiries_forces_and_open_holds_are_told_apart() {
    let p = "/palisade/locks/";
    let h = |lease: &str| format!("{p}chaos/cells/key-1/h/x/{lease}");
    let g = |lease: &str| format!("{p}chaos/cells/key-1/g/x/{lease}");
    let meta = r#"{"spiffe_id":"spiffe://chaos/w","class":"cells","mode":"exclusive","epoch":2,"attempt":1}"#;
    let read = Read {
        cluster_id: 1,
        initial: vec![
            change(3, false, &h("00000000000000a0"), meta, 3),
            change(
                4,
                false,
                &format!("{p}chaos/cells/key-2/h/s/00000000000000b0"),
                meta,
                4,
            ),
        ],
        changes: vec![
            change(5, false, &h("00000000000000a1"), meta, 5),
            change(5, false, &g("00000000000000a1"), "{}", 5),
            change(7, true, &h("00000000000000a1"), "", 5),
            change(7, true, &g("00000000000000a1"), "", 5),
            change(9, false, &h("00000000000000a2"), meta, 9),
            change(11, true, &h("00000000000000a2"), "", 9),
            change(12, false, &h("00000000000000a3"), meta, 12),
            change(14, true, &h("00000000000000a3"), "", 12),
            change(
                14,
                false,
                &g("00000000000000a3"),
                r#"{"forced":{"request_id":"r","requester":"x","reason":"stuck"}}"#,
                12,
            ),
            change(15, true, &h("00000000000000a0"), "", 3),
            change(15, true, &h("000000000000009f"), "", 2),
            change(16, false, &h("00000000000000a4"), meta, 16),
            change(
                17,
                false,
                &format!("{p}chaos/cells/key-1/q/x/00000000000000a5"),
                "{}",
                17,
            ),
        ],
    };
    let lock = LockName {
        ns: "chaos".into(),
        class: "cells".into(),
        key: "key-1".into(),
    };
    let hold = |epoch, grant_rev, end_rev, end, lease| Event::EtcdHold {
        lock: lock.clone(),
        epoch,
        grant_rev,
        end_rev,
        exclusive: true,
        end,
        space: 1,
        session: Some(lease),
        tier: None,
    };
    let found = holds(
        &RootKeys::new("/palisade/"),
        &read,
        RevisionSpace {
            epoch: 3,
            from: 5,
            number: 1,
        },
        None,
    );
    assert_eq!(
        found.holds,
        vec![
            hold(2, 5, Some(7), HoldEnd::Released, 0xa1),
            hold(2, 9, Some(11), HoldEnd::Expired, 0xa2),
            Event::EtcdForced {
                lock: lock.clone(),
                epoch: 2,
                grant_rev: 12,
                end_rev: 14,
                space: 1,
                request_id: "r".into(),
            },
            hold(2, 12, Some(14), HoldEnd::Forced, 0xa3),
            // The hold created at 3 was in the snapshot (revision 4) the space began
            // from: it came back, and expired at 15.
            Event::RestoredHold {
                lock: lock.clone(),
                epoch: 2,
                grant_rev: 3,
                restored_rev: 4,
                space: 1,
                end_rev: Some(15),
                exclusive: true,
                end: HoldEnd::Expired,
            },
            hold(2, 16, None, HoldEnd::Open, 0xa4),
            Event::RestoredHold {
                lock: LockName {
                    key: "key-2".into(),
                    ..lock.clone()
                },
                epoch: 2,
                grant_rev: 4,
                restored_rev: 4,
                space: 1,
                end_rev: None,
                exclusive: false,
                end: HoldEnd::Open,
            },
        ]
    );
    // The delete of a key the space neither created nor began with.
    assert_eq!(found.unmatched_ends, 1);
}

#[test]
fn holds_without_a_grant_record_end_by_their_lease_marker() {
    let p = "/palisade/";
    let h = |lease: &str| format!("{p}locks/chaos/cells/key-1/h/x/{lease}");
    let bare = r#"{"spiffe_id":"spiffe://chaos/w","class":"cells","mode":"exclusive","epoch":0,"attempt":1,"grant_record":false}"#;
    let read = Read {
        cluster_id: 1,
        initial: vec![change(1, false, &h("00000000000000c0"), bare, 1)],
        changes: vec![
            change(2, false, &h("00000000000000c1"), bare, 2),
            // Released: the hold key alone.
            change(3, true, &h("00000000000000c1"), "", 2),
            change(4, false, &h("00000000000000c2"), bare, 4),
            // Its detached session's record goes with it: expired.
            change(5, true, &h("00000000000000c2"), "", 4),
            change(5, true, &format!("{p}sessions/00000000000000c2"), "", 4),
            // A restored hold whose lease's marker goes with it: expired.
            change(6, true, &format!("{p}leases/00000000000000c0"), "", 1),
            change(6, true, &h("00000000000000c0"), "", 1),
        ],
    };
    let found = holds(
        &RootKeys::new(p),
        &read,
        RevisionSpace {
            epoch: 0,
            from: 2,
            number: 0,
        },
        None,
    );
    let ends: Vec<(i64, HoldEnd)> = found
        .holds
        .iter()
        .map(|e| match e {
            Event::EtcdHold { grant_rev, end, .. } => (*grant_rev, *end),
            Event::RestoredHold { grant_rev, end, .. } => (*grant_rev, *end),
            other => panic!("not a hold: {other:?}"),
        })
        .collect();
    assert_eq!(
        ends,
        [
            (2, HoldEnd::Released),
            (4, HoldEnd::Expired),
            (1, HoldEnd::Expired)
        ]
    );
    assert_eq!(found.unmatched_ends, 0);
}
