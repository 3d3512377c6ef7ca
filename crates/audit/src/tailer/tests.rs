use super::*;
use crate::LockEventKind;
use palisade_fence::{Epoch, FencingToken};

const P: &str = "/p/locks/";
const LEASE: &str = "00000000000000ff";

fn meta(epoch: u16) -> Vec<u8> {
    format!(r#"{{"spiffe_id":"spiffe://t/a","class":"c","mode":"exclusive","epoch":{epoch},"attempt":3}}"#)
        .into_bytes()
}

fn put(rev: i64, key: &str, value: Vec<u8>, version: i64, create: i64) -> Change {
    Change {
        revision: rev,
        delete: false,
        key: key.into(),
        value,
        version,
        create_revision: create,
        lease: 0,
        prev: None,
    }
}

fn del(rev: i64, key: &str, prev: Option<(Vec<u8>, i64)>) -> Change {
    Change {
        revision: rev,
        delete: true,
        key: key.into(),
        value: vec![],
        version: 0,
        create_revision: 0,
        lease: 0,
        prev,
    }
}

/// Classifies `changes` as the tailer does: lock keys as events, the rest for the
/// leases that ended.
fn classify_all(changes: &[Change]) -> Vec<LockEvent> {
    let keys = RootKeys::new("/p/");
    let (locks, others): (Vec<Change>, Vec<Change>) = changes
        .iter()
        .cloned()
        .partition(|c| c.key.starts_with(keys.locks().as_bytes()));
    classify(ClusterId(1), &keys, &locks, &lease_ends(&keys, &others))
}

fn kinds(events: &[LockEvent]) -> Vec<(u64, u32, LockEventKind)> {
    events
        .iter()
        .map(|e| (e.revision.get(), e.seq, e.kind))
        .collect()
}

#[test]
fn grant_release_expire_force() {
    let h = format!("{P}ns/c/a%2Fb/h/x/{LEASE}");
    let g = format!("{P}ns/c/a%2Fb/g/x/{LEASE}");
    let q = format!("{P}ns/c/a%2Fb/q/x/{LEASE}");
    let forced = br#"{"forced":{"request_id":"r1","requester":"alice","reason":"stuck"}}"#.to_vec();
    let changes = vec![
        del(5, &q, Some((meta(1), 4))),
        put(5, &h, meta(1), 1, 5),
        put(5, &g, meta(1), 1, 5),
        del(6, &h, Some((meta(1), 5))),
        del(6, &g, Some((meta(1), 5))),
        put(7, &h, meta(1), 1, 7),
        del(8, &h, Some((meta(1), 7))),
        put(9, &h, meta(1), 1, 9),
        del(10, &h, Some((meta(1), 9))),
        put(10, &g, forced, 2, 9),
        del(11, &g, Some((meta(1), 9))),
    ];
    let events = classify_all(&changes);
    use LockEventKind::{Expire, Force, Grant, Release};
    assert_eq!(
        kinds(&events),
        [
            (5, 0, Grant),
            (6, 0, Release),
            (7, 0, Grant),
            (8, 0, Expire),
            (9, 0, Grant),
            (10, 0, Force)
        ]
    );
    let token = FencingToken::from_parts(Epoch::new(1).unwrap(), Revision::new(5)).unwrap();
    assert_eq!(events[0].token, Some(token));
    assert_eq!(events[1].token, Some(token));
    assert_eq!(events[0].lock_key.as_deref(), Some("a/b"));
    assert_eq!(events[0].namespace.as_deref(), Some("ns"));
    assert_eq!(events[0].class.as_deref(), Some("c"));
    assert_eq!(events[3].spiffe_id.as_deref(), Some("spiffe://t/a"));
}

/// Holder meta of a hold granted without a grant record (a class with no lock-delay).
fn bare_meta(epoch: u16) -> Vec<u8> {
    format!(r#"{{"spiffe_id":"spiffe://t/a","class":"c","mode":"exclusive","epoch":{epoch},"attempt":3,"grant_record":false}}"#)
        .into_bytes()
}

#[test]
fn holds_without_a_grant_record_end_by_their_lease_marker() {
    const OTHER: &str = "0000000000000100";
    let h = format!("{P}ns/c/k/h/x/{LEASE}");
    let g = format!("{P}ns/c/k/g/x/{LEASE}");
    let forced = br#"{"forced":{"request_id":"r1","requester":"alice","reason":"stuck"}}"#.to_vec();
    let changes = vec![
        put(5, &h, bare_meta(1), 1, 5),
        // Released: the hold key alone.
        del(6, &h, Some((bare_meta(1), 5))),
        put(7, &h, bare_meta(1), 1, 7),
        // Another lease's marker ends in the same revision: still a release.
        del(8, &h, Some((bare_meta(1), 7))),
        del(8, &format!("/p/leases/{OTHER}"), None),
        put(9, &h, bare_meta(1), 1, 9),
        // The lease expires: its marker goes with the hold.
        del(10, &format!("/p/leases/{LEASE}"), None),
        del(10, &h, Some((bare_meta(1), 9))),
        put(11, &h, bare_meta(1), 1, 11),
        // A detached session's record is its lease's marker.
        del(12, &h, Some((bare_meta(1), 11))),
        del(12, &format!("/p/sessions/{LEASE}"), None),
        put(13, &h, bare_meta(1), 1, 13),
        // A force release puts a record where there was none.
        del(14, &h, Some((bare_meta(1), 13))),
        put(14, &g, forced, 1, 14),
        put(15, &h, meta(1), 1, 15),
        // A hold with a record whose lease ends with no marker (a lease from before
        // markers): the record left behind says expiry.
        del(16, &h, Some((meta(1), 15))),
    ];
    let events = classify_all(&changes);
    use LockEventKind::{Expire, Force, Grant, Release};
    assert_eq!(
        kinds(&events),
        [
            (5, 0, Grant),
            (6, 0, Release),
            (7, 0, Grant),
            (8, 0, Release),
            (9, 0, Grant),
            (10, 0, Expire),
            (11, 0, Grant),
            (12, 0, Expire),
            (13, 0, Grant),
            (14, 0, Force),
            (15, 0, Grant),
            (16, 0, Expire),
        ]
    );
}

#[test]
fn a_hand_over_at_release_is_a_release_then_a_grant_in_one_revision() {
    const NEXT: &str = "0000000000000100";
    let lock = format!("{P}ns/c/k");
    let next_meta = || {
        br#"{"spiffe_id":"spiffe://t/b","class":"c","mode":"exclusive","epoch":1,"attempt":8}"#
            .to_vec()
    };
    let changes = vec![
        del(12, &format!("{lock}/h/x/{LEASE}"), Some((meta(1), 9))),
        del(12, &format!("{lock}/g/x/{LEASE}"), Some((meta(1), 9))),
        del(12, &format!("{lock}/q/x/{NEXT}"), Some((next_meta(), 10))),
        put(12, &format!("{lock}/h/x/{NEXT}"), next_meta(), 1, 12),
        put(12, &format!("{lock}/g/x/{NEXT}"), next_meta(), 1, 12),
    ];
    let events = classify_all(&changes);
    assert_eq!(
        kinds(&events),
        [
            (12, 0, LockEventKind::Release),
            (12, 1, LockEventKind::Grant)
        ]
    );
    let epoch = Epoch::new(1).unwrap();
    assert_eq!(
        events[0].token,
        Some(FencingToken::from_parts(epoch, Revision::new(9)).unwrap())
    );
    assert_eq!(
        events[1].token,
        Some(FencingToken::from_parts(epoch, Revision::new(12)).unwrap())
    );
    assert_eq!(events[0].spiffe_id.as_deref(), Some("spiffe://t/a"));
    assert_eq!(events[1].spiffe_id.as_deref(), Some("spiffe://t/b"));
}

#[test]
fn one_revision_with_several_expiries_numbers_them() {
    let a = format!("{P}ns/c/a/h/s/{LEASE}");
    let b = format!("{P}ns/c/b/h/s/{LEASE}");
    let cancel = format!("{P}ns/c/a/c/{LEASE}/7");
    let changes = vec![
        del(4, &a, Some((meta(0), 2))),
        del(4, &cancel, None),
        del(4, &b, Some((meta(0), 3))),
    ];
    let events = classify_all(&changes);
    assert_eq!(
        kinds(&events),
        [(4, 0, LockEventKind::Expire), (4, 1, LockEventKind::Expire)]
    );
    assert_eq!(events[1].lock_key.as_deref(), Some("b"));
}

#[test]
fn stray_keys_make_no_rows() {
    let strays = [
        format!("{P}ns/c/k/c/{LEASE}/1"),
        format!("{P}ns/c/k/h/x/{LEASE}/extra"),
        format!("{P}ns/c/k/h/z/{LEASE}"),
        format!("{P}ns/c/k/h/x/nothex"),
        format!("{P}ns/c/k%zz/h/x/{LEASE}"),
        format!("{P}NS/c/k/h/x/{LEASE}"),
        format!("{P}garbage"),
        "/elsewhere/ns/c/k/h/x/00000000000000ff".to_owned(),
    ];
    let mut changes = Vec::new();
    for (i, k) in strays.iter().enumerate() {
        let rev = 2 * i as i64 + 2;
        changes.push(put(rev, k, meta(0), 1, rev));
        changes.push(del(rev + 1, k, Some((meta(0), rev))));
    }
    // A well-formed hold key whose value is not holder meta is not the lock core's.
    let h = format!("{P}ns/c/k/h/x/{LEASE}");
    changes.push(put(100, &h, b"junk".to_vec(), 1, 100));
    changes.push(del(101, &h, Some((b"junk".to_vec(), 100))));
    // A rewrite is not a grant.
    changes.push(put(102, &h, meta(0), 2, 100));
    assert!(classify_all(&changes).is_empty());
}

#[test]
fn epoch_records_and_switched_rehome_records_are_epoch_rows_and_nothing_else_is() {
    use crate::EpochAdvance;
    use palisade_api::{EpochReason, EpochRecord, RehomePhase, RehomeRecord};
    let keys = RootKeys::new("/p/");
    let cluster = ClusterId(7);
    let record = EpochRecord::new(
        Epoch::new(3).unwrap(),
        9,
        EpochReason::Rehome,
        Revision::new(40),
    );
    let mut rehome = RehomeRecord {
        ns: "orders".into(),
        from: "home".into(),
        to: "second".into(),
        phase: RehomePhase::Draining,
        started_at_ms: 1,
        epoch: None,
    };
    let draining = serde_json::to_vec(&rehome).unwrap();
    rehome.phase = RehomePhase::Switched;
    rehome.epoch = Some(Epoch::new(3).unwrap());
    let switched = serde_json::to_vec(&rehome).unwrap();
    let changes = vec![
        put(
            41,
            "/p/config/epoch",
            serde_json::to_vec(&record).unwrap(),
            2,
            3,
        ),
        put(42, "/p/config/epoch", b"not json".to_vec(), 3, 3),
        put(43, "/p/tier/rehome/orders", draining, 1, 43),
        put(44, "/p/tier/rehome/orders", switched, 2, 43),
        del(45, "/p/tier/rehome/orders", None),
        del(46, "/p/config/epoch", None),
        put(47, "/p/config/ns/orders", b"{}".to_vec(), 1, 47),
        put(
            48,
            "/q/config/epoch",
            serde_json::to_vec(&record).unwrap(),
            1,
            48,
        ),
    ];
    let rows = epochs::EpochChanges::of(cluster, &keys, &changes);
    assert_eq!(
        rows.advances,
        [EpochAdvance::new(cluster, Revision::new(41), record)]
    );
    assert_eq!(rows.switches.len(), 1);
    let s = &rows.switches[0];
    assert_eq!(
        (s.cluster_id, s.revision.get(), s.namespace.as_str()),
        (cluster, 44, "orders")
    );
    assert_eq!(
        (s.from.as_str(), s.to.as_str(), s.epoch.get()),
        ("home", "second", 3)
    );
}
