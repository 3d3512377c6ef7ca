//! `held_lease_quota` slots taken in the acquire's first Txn, and the session record's
//! create revision compared there and in the release Txn: a stale (cached) record never
//! acts for a session whose record is gone or replaced.

use std::time::Duration;

use etcd_client::{GetOptions, PutOptions};
use palisade_lock::{ErrorKind, Mode, SessionRecord, SpiffeId};

use crate::support::{fixture, keys_under, lock, secs, ROOT};

const OWNER: &str = "spiffe://test/owner";

async fn detached(f: &crate::support::Fixture) -> SessionRecord {
    f.locker
        .open_detached_session(SpiffeId::new(OWNER).unwrap(), Duration::from_secs(30))
        .await
        .unwrap()
}

fn slot_keys(keys: Vec<String>) -> Vec<String> {
    keys.into_iter()
        .filter(|k| k.starts_with(&format!("{ROOT}quota/ns/slot/")))
        .collect()
}

#[tokio::test]
async fn etcd_a_replaced_session_record_fails_the_acquire_and_release_of_a_stale_copy() {
    let f = fixture(1).await;
    let record = detached(&f).await;
    let hold = f
        .locker
        .acquire_in_quota(&record, &lock("a"), Mode::Exclusive, secs(5), None, 10)
        .await
        .unwrap();
    let grant_rev = hold.grant_rev().unwrap();
    hold.forget();
    let slots = slot_keys(keys_under(f.locker.client(), ROOT).await);
    assert_eq!(slots.len(), 1, "{slots:?}");
    // The record is deleted and written again on the same lease (another create
    // revision), naming another owner: `record` is now a stale copy of it.
    let key = format!("{ROOT}sessions/{}", record.lease);
    let mut c = f.locker.client().clone();
    c.delete(key.as_str(), None).await.unwrap();
    let replaced = serde_json::json!({ "lease": record.lease.get(),
        "spiffe_id": "spiffe://test/other", "ttl": 30_000 });
    c.put(
        key.as_str(),
        replaced.to_string(),
        Some(PutOptions::new().with_lease(record.lease.get())),
    )
    .await
    .unwrap();
    // Acting on the stale copy: no grant, no slot, no waiter; the hold stays.
    let e = f
        .locker
        .acquire_in_quota(&record, &lock("b"), Mode::Exclusive, secs(2), None, 10)
        .await
        .unwrap_err();
    assert!(e.is_session_lost(), "{e:?}");
    let e = f
        .locker
        .release_in_session(&lock("a"), &record, Mode::Exclusive, grant_rev)
        .await
        .unwrap_err();
    assert!(e.is_not_held(), "{e:?}");
    let keys = keys_under(f.locker.client(), ROOT).await;
    assert!(
        !keys.iter().any(|k| k.contains("/locks/ns/c/b/")),
        "{keys:?}"
    );
    assert_eq!(slot_keys(keys), slots, "the held slot only");
    assert_eq!(
        f.locker.lock_state(&lock("a")).await.unwrap().holders.len(),
        1
    );
    // The record as it is now: the release goes through and frees the slot.
    let fresh = f.locker.session_record(record.lease).await.unwrap();
    assert_ne!(fresh.opened_rev, record.opened_rev);
    f.locker
        .release_in_session(&lock("a"), &fresh, Mode::Exclusive, grant_rev)
        .await
        .unwrap();
    assert!(slot_keys(keys_under(f.locker.client(), ROOT).await).is_empty());
}

#[tokio::test]
async fn etcd_a_lowered_quota_admits_nobody_until_enough_slots_are_freed() {
    let f = fixture(1).await;
    let record = detached(&f).await;
    // Ten holds under a quota of 1,000: slots picked at random among 1,000.
    let mut holds = Vec::new();
    for i in 0..10 {
        let h = f
            .locker
            .acquire_in_quota(
                &record,
                &lock(&format!("k{i}")),
                Mode::Exclusive,
                secs(5),
                None,
                1000,
            )
            .await
            .unwrap();
        holds.push((format!("k{i}"), h.grant_rev().unwrap()));
        h.forget();
    }
    assert_eq!(
        slot_keys(keys_under(f.locker.client(), ROOT).await).len(),
        10
    );
    // The quota lowered to 1 and to 10: refused, whichever slot is picked.
    for quota in [1, 10] {
        let e = f
            .locker
            .acquire_in_quota(
                &record,
                &lock("more"),
                Mode::Exclusive,
                secs(2),
                None,
                quota,
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            &ErrorKind::QuotaExceeded {
                ns: "ns".into(),
                quota
            },
            "quota {quota}"
        );
    }
    // Released through another locker (which reads where each slot is): the slots go.
    let other = crate::support::connect(f.cluster.endpoints(), &f.dir)
        .await
        .unwrap();
    for (key, rev) in holds.drain(..9) {
        other
            .release_in_session(&lock(&key), &record, Mode::Exclusive, rev)
            .await
            .unwrap();
    }
    let left = slot_keys(keys_under(f.locker.client(), ROOT).await);
    assert_eq!(left.len(), 1, "{left:?}");
    let e = f
        .locker
        .acquire_in_quota(&record, &lock("more"), Mode::Exclusive, secs(2), None, 1)
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::QuotaExceeded { .. }), "{e:?}");
    // Freed by the last release: the quota of 10 admits again.
    let (key, rev) = holds.pop().unwrap();
    other
        .release_in_session(&lock(&key), &record, Mode::Exclusive, rev)
        .await
        .unwrap();
    f.locker
        .acquire_in_quota(&record, &lock("more"), Mode::Exclusive, secs(2), None, 10)
        .await
        .unwrap()
        .forget();
    let mut c = f.locker.client().clone();
    let count = c
        .get(
            format!("{ROOT}quota/ns/slot/"),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count();
    assert_eq!(count, 1);
}
