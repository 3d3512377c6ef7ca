//! Shared holds: many at once, an exclusive waiter granted only after the last of them,
//! and a later shared waiter only after the exclusive hold.

use etcd_client::EventType;
use palisade_lock::Mode;

use crate::support::{
    base, fixture, keys_under, lock, secs, session, spawn_waiter, token, PrefixWatch,
};

#[tokio::test]
async fn etcd_shared_holders_exclusive_waiter_and_later_shared_waiter() {
    let f = fixture(1).await;
    let name = lock("rw");
    let mut readers = Vec::new();
    for _ in 0..5 {
        let s = session(&f.locker, 10).await;
        readers.push(
            f.locker
                .acquire(&s, &name, Mode::Shared, secs(5))
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        keys_under(f.locker.client(), &format!("{}h/s/", base("rw")))
            .await
            .len(),
        5,
        "five shared holders at once"
    );
    let writer_s = session(&f.locker, 10).await;
    let writer = spawn_waiter(&f.locker, &writer_s, &name, Mode::Exclusive, secs(30)).await;
    let late_s = session(&f.locker, 10).await;
    let late = spawn_waiter(&f.locker, &late_s, &name, Mode::Shared, secs(30)).await;

    let max_reader = readers.iter().map(token).max().unwrap();
    let last_reader = readers.pop().unwrap();
    // Every change to the holds from here on, in revision order: the order of grants and
    // releases is read from etcd, not guessed from timing.
    let mut holds = PrefixWatch::start(f.locker.client(), &format!("{}h/", base("rw"))).await;
    for r in readers {
        r.release().await.unwrap();
    }
    let state = f.locker.lock_state(&name).await.unwrap();
    assert_eq!(
        state.holders.len(),
        1,
        "one shared holder remains: {state:?}"
    );
    assert_eq!(
        state.waiters.iter().map(|w| w.mode).collect::<Vec<_>>(),
        [Mode::Exclusive, Mode::Shared],
        "both waiters still queued"
    );

    let last_reader_key = format!("{}h/s/{}", base("rw"), last_reader.session().lease());
    last_reader.release().await.unwrap();
    let w = writer.await.unwrap().unwrap();
    assert!(token(&w) > max_reader);
    let state = f.locker.lock_state(&name).await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].mode, Mode::Exclusive);
    assert_eq!(
        state.waiters.len(),
        1,
        "the shared waiter still queued: {state:?}"
    );
    let wt = token(&w);
    let writer_key = format!("{}h/x/{}", base("rw"), writer_s.lease());
    w.release().await.unwrap();
    let late_key = format!("{}h/s/{}", base("rw"), late_s.lease());
    let events = holds
        .until(|t, k| t == EventType::Put && k == late_key)
        .await;
    let at = |kind: EventType, key: &str| {
        events
            .iter()
            .position(|e| e.0 == kind && e.1 == key)
            .unwrap_or_else(|| panic!("no {kind:?} of {key} in {events:?}"))
    };
    assert!(
        at(EventType::Delete, &last_reader_key) < at(EventType::Put, &writer_key),
        "the exclusive waiter was granted only after the last shared holder left: {events:?}"
    );
    assert!(
        at(EventType::Delete, &writer_key) < at(EventType::Put, &late_key),
        "the later shared waiter was granted only after the exclusive hold ended: {events:?}"
    );
    let l = late.await.unwrap().unwrap();
    assert!(token(&l) > wt);
    assert_eq!(l.mode(), Mode::Shared);
}
