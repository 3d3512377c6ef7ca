//! Keys under the lock prefix that no lock of this locker wrote, and lock keys that are
//! prefixes of each other: they never block a grant, and those in the shape of a lock's
//! key are reported (and, on no lease, deleted by the next acquire).

use std::time::Duration;

use palisade_lock::Mode;

use crate::support::{
    base, fixture, lock, revision, secs, session, spawn_waiter, token, within, NS, ROOT,
};

#[tokio::test]
async fn etcd_keys_that_prefix_each_other_and_stray_keys_do_not_interfere() {
    let f = fixture(1).await;
    let c = f.locker.client().clone();
    let s1 = session(&f.locker, 10).await;
    let s2 = session(&f.locker, 10).await;
    let s3 = session(&f.locker, 10).await;
    let h1 = f
        .locker
        .acquire(&s1, &lock("a/b"), Mode::Exclusive, secs(2))
        .await
        .unwrap();
    let h2 = f
        .locker
        .acquire(&s2, &lock("a/bc"), Mode::Exclusive, secs(2))
        .await
        .unwrap();
    let h3 = f
        .locker
        .acquire(&s3, &lock("a"), Mode::Exclusive, secs(2))
        .await
        .unwrap();
    assert!(token(&h1) < token(&h2) && token(&h2) < token(&h3));
    // Strays written by someone else next to and around a lock's keys.
    for stray in [
        format!("{ROOT}locks/{NS}/c/a%2Fb"),
        format!("{ROOT}locks/{NS}/c/a%2Fbz/q/x/0000000000000001"),
        format!("{ROOT}locks/{NS}/c/a%2Fb%2F/h/x/0000000000000001"),
        format!("{ROOT}locks/{NS}/c/stray"),
        format!("{ROOT}locks/{NS}/c/a%2Fb/other"),
    ] {
        c.clone().put(stray, "x", None).await.unwrap();
    }
    h1.release().await.unwrap();
    let before = revision(&c).await;
    let again = f
        .locker
        .acquire(&s2, &lock("a/b"), Mode::Exclusive, secs(2))
        .await
        .unwrap();
    assert_eq!(
        token(&again).revision().get(),
        (before + 1) as u64,
        "granted in one Txn: nothing queued or held"
    );
    again.release().await.unwrap();
    h2.release().await.unwrap();
    h3.release().await.unwrap();
}

#[tokio::test]
async fn etcd_stray_keys_in_reserved_sub_prefixes_never_block_and_in_shape_ones_are_reported() {
    let f = fixture(1).await;
    let c = f.locker.client().clone();
    let s = session(&f.locker, 10).await;
    let name = lock("stray");
    let b = base("stray");
    // Outside the lease-key shape: ignored by acquires and by lock_state.
    for stray in [
        "q/x/junk",
        "q/s/junk",
        "q/junk",
        "q/x/",
        "h/x/junk",
        "h/s/zz",
        "h/z/0000000000000001",
        "g/x/junk",
        "g/s/ffffffffffffffffff",
    ] {
        c.clone()
            .put(format!("{b}{stray}"), "junk", None)
            .await
            .unwrap();
    }
    for mode in [Mode::Exclusive, Mode::Shared] {
        let h = f
            .locker
            .acquire(&s, &name, mode, within(Duration::from_secs(2)))
            .await
            .unwrap_or_else(|e| panic!("{mode:?} blocked by stray keys: {e:?}"));
        h.release().await.unwrap();
    }
    // A contended grant (through the waiter path) is not blocked either.
    let s2 = session(&f.locker, 10).await;
    let h = f
        .locker
        .acquire(&s, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let waiter = spawn_waiter(&f.locker, &s2, &name, Mode::Exclusive, secs(5)).await;
    h.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    let state = f.locker.lock_state(&name).await.unwrap();
    assert!(state.foreign_keys.is_empty(), "{state:?}");

    // Inside the shape but on no lease: lock_state lists it, with its lease (none), as no
    // waiter; the next acquire deletes it and is granted at once.
    let inside = format!("{b}q/x/0000000000000001");
    c.clone().put(inside.as_str(), "junk", None).await.unwrap();
    let state = f.locker.lock_state(&name).await.unwrap();
    assert_eq!(
        state.foreign_keys,
        vec![palisade_lock::ForeignKey {
            key: inside.clone(),
            lease: palisade_lock::LeaseId::new(0)
        }],
        "{state:?}"
    );
    assert!(state.holders.is_empty() && state.waiters.is_empty());
    let h = f
        .locker
        .acquire(&s, &name, Mode::Exclusive, within(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(c
        .clone()
        .get(inside.as_str(), None)
        .await
        .unwrap()
        .kvs()
        .is_empty());
    h.release().await.unwrap();
}
