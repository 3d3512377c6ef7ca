//! A session's lease ending (expired or revoked): its holds are lost within its TTL, the
//! next waiter gets a higher token, and its own waiters are never granted.

use std::time::Duration;

use etcd_client::EventType;
use palisade_lock::{LossReason, Mode};
use tokio::time::Instant;

use crate::support::{
    base, fixture, keys_under, lock, secs, session, spawn_waiter, token, PrefixWatch,
};

#[tokio::test]
async fn etcd_expired_holder_loses_within_ttl_and_next_waiter_gets_higher_token() {
    let f = fixture(1).await;
    let name = lock("exp");
    let a = session(&f.locker, 2).await;
    let ha = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let b = session(&f.locker, 10).await;
    let waiter = spawn_waiter(&f.locker, &b, &name, Mode::Exclusive, secs(20)).await;

    // The bound is measured from the moment renewals stop (the last renewal was sent
    // before it, so the lease ends no later than TTL after it), with the TTL etcd granted.
    let bound = a.ttl() + Duration::from_secs(1);
    let stopped = Instant::now();
    a.stop_keepalive();
    let reason = tokio::time::timeout(bound, ha.lost())
        .await
        .expect("loss signal within TTL + 1 s");
    assert_eq!(reason, LossReason::KeepaliveFailed);
    let hb = waiter.await.unwrap().unwrap();
    let granted_after = stopped.elapsed();
    assert!(
        granted_after <= bound,
        "next waiter granted {granted_after:?} after keepalive stopped"
    );
    assert!(token(&hb) > token(&ha));
    // The expired hold cannot be released: typed NotHeld, never success.
    let err = ha.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    hb.release().await.unwrap();
}

#[tokio::test]
async fn etcd_waiter_whose_lease_expires_is_never_granted() {
    let f = fixture(1).await;
    let name = lock("w");
    let h = session(&f.locker, 10).await;
    let held = f
        .locker
        .acquire(&h, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let w = session(&f.locker, 2).await;
    let doomed = spawn_waiter(&f.locker, &w, &name, Mode::Exclusive, secs(30)).await;
    let v = session(&f.locker, 10).await;
    let next = spawn_waiter(&f.locker, &v, &name, Mode::Exclusive, secs(30)).await;

    // W's lease expires while it waits: its waiter key goes with it.
    let mut queue = PrefixWatch::start(f.locker.client(), &format!("{}q/", base("w"))).await;
    w.stop_keepalive();
    let (gone, _) = queue.next(EventType::Delete).await;
    assert!(gone.ends_with(&w.lease().to_string()));
    let err = doomed.await.unwrap().unwrap_err();
    assert!(err.is_session_lost(), "{err:?}");

    let held_token = token(&held);
    held.release().await.unwrap();
    let hv = next.await.unwrap().unwrap();
    assert!(token(&hv) > held_token);
    let holds = keys_under(f.locker.client(), &format!("{}h/", base("w"))).await;
    assert_eq!(
        holds,
        vec![format!("{}h/x/{}", base("w"), v.lease())],
        "only V holds; W never did"
    );
}

#[tokio::test]
async fn etcd_waiter_whose_lease_is_revoked_before_it_wakes_is_never_granted() {
    // Unlike the expiry test, the waiter's own loss signal has not fired yet when it wakes
    // (its lease is revoked behind its back, long before its next keepalive): only etcd
    // can refuse it, because its waiter key is gone and a put on the dead lease fails.
    let f = fixture(1).await;
    let name = lock("rv");
    let h = session(&f.locker, 10).await;
    let held = f
        .locker
        .acquire(&h, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let w = session(&f.locker, 30).await;
    let doomed = spawn_waiter(&f.locker, &w, &name, Mode::Exclusive, secs(30)).await;
    let v = session(&f.locker, 10).await;
    let next = spawn_waiter(&f.locker, &v, &name, Mode::Exclusive, secs(30)).await;

    let mut queue = PrefixWatch::start(f.locker.client(), &format!("{}q/", base("rv"))).await;
    f.locker
        .client()
        .clone()
        .lease_revoke(w.lease().get())
        .await
        .unwrap();
    queue.next(EventType::Delete).await;
    assert_eq!(w.loss(), None, "the session has not noticed yet");
    let mut holds = PrefixWatch::start(f.locker.client(), &format!("{}h/", base("rv"))).await;
    held.release().await.unwrap();

    let err = doomed.await.unwrap().unwrap_err();
    assert!(err.is_session_lost(), "{err:?}");
    let hv = next.await.unwrap().unwrap();
    let v_hold = format!("{}h/x/{}", base("rv"), v.lease());
    let events = holds.until(|t, k| t == EventType::Put && k == v_hold).await;
    let w_lease = w.lease().to_string();
    assert!(
        events.iter().all(|e| !e.1.ends_with(&w_lease)),
        "W never held: {events:?}"
    );
    assert!(token(&hv).revision().get() > 0);
}
