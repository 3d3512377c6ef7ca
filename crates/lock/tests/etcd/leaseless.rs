//! Keys that no live session owns: copies of holds, waiters and quota slots without
//! their lease (what `etcdctl make-mirror` writes) are never holders, waiters or taken
//! slots. `lock_state` lists them as foreign with their lease, an acquire deletes the
//! ones under its lock and is granted within its normal wait, and a quota take
//! overwrites a lease-less slot.

use std::time::Duration;

use etcd_client::GetOptions;
use palisade_lock::{LeaseId, Mode, SpiffeId};

use crate::support::{fixture, lock, within, ROOT};

const OWNER: &str = "spiffe://test/owner";

/// Every key with its value under `prefix`, and the lease etcd keeps it on.
async fn kvs(c: &etcd_client::Client, prefix: &str) -> Vec<(String, Vec<u8>, i64)> {
    c.clone()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.value().to_vec(),
                kv.lease(),
            )
        })
        .collect()
}

#[tokio::test]
async fn etcd_leaseless_copies_of_holds_waiters_and_slots_count_for_nothing() {
    let f = fixture(1).await;
    let c = f.locker.client().clone();
    let quota = 4;
    let names = ["m0", "m1", "m2"].map(lock);
    // A session holds three locks of the namespace, three of its four quota slots taken.
    let first = f
        .locker
        .open_detached_session(SpiffeId::new(OWNER).unwrap(), Duration::from_secs(30))
        .await
        .unwrap();
    for name in &names {
        f.locker
            .acquire_in_quota(
                &first,
                name,
                Mode::Exclusive,
                within(Duration::from_secs(2)),
                None,
                quota,
            )
            .await
            .unwrap()
            .forget();
    }
    let locks_prefix = format!("{ROOT}locks/ns/");
    let slots_prefix = format!("{ROOT}quota/ns/slot/");
    let mut copied = kvs(&c, &locks_prefix).await;
    copied.extend(kvs(&c, &slots_prefix).await);
    assert_eq!(copied.len(), 6, "three holds and three slots: {copied:?}");
    assert!(copied
        .iter()
        .all(|(_, _, lease)| *lease == first.lease.get()));
    // The session ends (its keys go with its lease), and the keys come back as a copy
    // without leases would write them.
    f.locker.revoke_session(first.lease).await.unwrap();
    assert!(kvs(&c, &locks_prefix).await.is_empty());
    for (key, value, _) in &copied {
        c.clone()
            .put(key.as_str(), value.clone(), None)
            .await
            .unwrap();
    }
    let hold_key = |name: &palisade_lock::LockName| {
        format!("{ROOT}locks/ns/c/{}/h/x/{}", name.key, first.lease)
    };

    // Status: no holder, the copy listed as foreign with no lease.
    let state = f.locker.lock_state(&names[0]).await.unwrap();
    assert!(state.holders.is_empty(), "{state:?}");
    assert!(state.waiters.is_empty(), "{state:?}");
    assert_eq!(state.foreign_keys.len(), 1, "{state:?}");
    assert_eq!(state.foreign_keys[0].key, hold_key(&names[0]));
    assert_eq!(state.foreign_keys[0].lease, LeaseId::new(0));

    // Another session takes all four slots and the three locks, each within a normal
    // wait: the copies neither hold the locks nor the slots.
    let second = f
        .locker
        .open_detached_session(SpiffeId::new(OWNER).unwrap(), Duration::from_secs(30))
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for name in names.iter().chain([&lock("m3")]) {
        let hold = f
            .locker
            .acquire_in_quota(
                &second,
                name,
                Mode::Exclusive,
                within(Duration::from_secs(2)),
                None,
                quota,
            )
            .await
            .unwrap_or_else(|e| panic!("{name:?} not granted past lease-less copies: {e:?}"));
        tokens.push(hold.token().unwrap());
        hold.forget();
    }
    assert_eq!(tokens.len(), 4);
    // The copied holds are gone, the copied slots now the second session's, and a fifth
    // hold is over the quota.
    for name in &names {
        let state = f.locker.lock_state(name).await.unwrap();
        assert!(state.foreign_keys.is_empty(), "{state:?}");
        assert_eq!(state.holders.len(), 1, "{state:?}");
        assert_eq!(state.holders[0].lease, second.lease);
    }
    let slots = kvs(&c, &slots_prefix).await;
    assert_eq!(slots.len(), 4, "{slots:?}");
    assert!(
        slots
            .iter()
            .all(|(_, _, lease)| *lease == second.lease.get()),
        "{slots:?}"
    );
    let over = f
        .locker
        .acquire_in_quota(
            &second,
            &lock("m4"),
            Mode::Exclusive,
            within(Duration::from_secs(2)),
            None,
            quota,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            over.kind(),
            palisade_lock::ErrorKind::QuotaExceeded { quota: 4, .. }
        ),
        "{over:?}"
    );
}

#[tokio::test]
async fn etcd_a_leaseless_waiter_ahead_and_a_hold_on_another_lease_do_not_block() {
    let f = fixture(1).await;
    let c = f.locker.client().clone();
    let name = lock("w");
    let base = format!("{ROOT}locks/ns/c/w/");
    let s = f
        .locker
        .open_detached_session(SpiffeId::new(OWNER).unwrap(), Duration::from_secs(30))
        .await
        .unwrap();
    let other = f
        .locker
        .open_detached_session(SpiffeId::new(OWNER).unwrap(), Duration::from_secs(30))
        .await
        .unwrap();
    // A waiter key with no lease, and a shared hold that names one lease but is on
    // another (live) one: neither can be a session's.
    let meta = r#"{"spiffe_id":"spiffe://test/owner","class":"c","mode":"exclusive","epoch":0,"attempt":1}"#;
    let waiter = format!("{base}q/x/00000000000000aa");
    c.clone().put(waiter.as_str(), meta, None).await.unwrap();
    let mislabelled = format!("{base}h/s/{}", s.lease);
    c.clone()
        .put(
            mislabelled.as_str(),
            meta,
            Some(etcd_client::PutOptions::new().with_lease(other.lease.get())),
        )
        .await
        .unwrap();
    let state = f.locker.lock_state(&name).await.unwrap();
    assert!(
        state.holders.is_empty() && state.waiters.is_empty(),
        "{state:?}"
    );
    let mut foreign: Vec<_> = state
        .foreign_keys
        .iter()
        .map(|k| (k.key.clone(), k.lease))
        .collect();
    foreign.sort();
    let mut expected = vec![
        (mislabelled.clone(), other.lease),
        (waiter.clone(), LeaseId::new(0)),
    ];
    expected.sort();
    assert_eq!(foreign, expected);
    let hold = f
        .locker
        .acquire_in_quota(
            &s,
            &name,
            Mode::Exclusive,
            within(Duration::from_secs(2)),
            None,
            10,
        )
        .await
        .unwrap();
    let state = f.locker.lock_state(&name).await.unwrap();
    assert!(state.foreign_keys.is_empty(), "{state:?}");
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].lease, s.lease);
    assert_eq!(state.holders[0].mode, Mode::Exclusive);
    hold.release().await.unwrap();
}
