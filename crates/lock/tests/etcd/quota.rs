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

/// The values of the namespace's slots, by key.
async fn slot_values(f: &crate::support::Fixture) -> Vec<(String, String)> {
    let mut c = f.locker.client().clone();
    let resp = c
        .get(
            format!("{ROOT}quota/ns/slot/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.value_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn etcd_an_acquire_retried_after_an_epoch_advance_takes_its_slot_anew() {
    let f = fixture(1).await;
    let (holder, waiter) = (detached(&f).await, detached(&f).await);
    let held = f
        .locker
        .acquire_in_quota(&holder, &lock("a"), Mode::Exclusive, secs(5), None, 10)
        .await
        .unwrap();
    let before = slot_values(&f).await;
    // The waiter's first Txn enqueues it and takes its slot.
    let locker = f.locker.clone();
    let waiting = tokio::spawn(async move {
        locker
            .acquire_in_quota(&waiter, &lock("a"), Mode::Exclusive, secs(10), None, 10)
            .await
    });
    let first = loop {
        let now = slot_values(&f).await;
        if now.len() == 2 {
            break now.into_iter().find(|s| !before.contains(s)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The epoch advances while it waits; the holder's release wakes it, it finds its
    // attempt stale, cleans up and tries again under the new epoch.
    let advanced = f
        .locker
        .advance_epoch(palisade_lock::EpochReason::Rehome)
        .await
        .unwrap();
    held.release().await.unwrap();
    let granted = waiting.await.unwrap().unwrap();
    assert_eq!(granted.token().unwrap().epoch(), advanced.epoch);
    // The holder's slot stays with its session (`Hold::release` leaves it); the waiter's:
    let after: Vec<_> = slot_values(&f)
        .await
        .into_iter()
        .filter(|s| !before.contains(s))
        .collect();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(
        after[0].1, first.1,
        "the retry took its slot with the first attempt's value"
    );
    // The first attempt's cleanup arriving late (as it does when etcd did not answer it
    // in time) deletes only a slot holding its own value: the retry's slot stays.
    let late = etcd_client::Txn::new().and_then([etcd_client::TxnOp::txn(
        etcd_client::Txn::new()
            .when([etcd_client::Compare::value(
                first.0.as_str(),
                etcd_client::CompareOp::Equal,
                first.1.as_str(),
            )])
            .and_then([etcd_client::TxnOp::delete(first.0.as_str(), None)]),
    )]);
    f.locker.client().clone().txn(late).await.unwrap();
    let mut now = slot_values(&f).await;
    now.retain(|s| !before.contains(s));
    assert_eq!(now, after);
}
