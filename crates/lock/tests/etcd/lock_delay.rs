//! A class's lock delay: after an expiry or a force release the next grant waits for it;
//! after an orderly release it does not.

use std::time::Duration;

use etcd_client::EventType;
use palisade_lock::{ForceMarker, LockName, Mode};
use tokio::time::Instant;

use crate::support::{
    class, fixture, revision, secs, session, spawn_waiter, token, PrefixWatch, NS2, ROOT,
};

#[tokio::test]
async fn etcd_lock_delay_applies_after_expiry_not_after_release() {
    let f = fixture(1).await;
    let mut delayed = class(NS2, "delayed", "d/");
    delayed.lock_delay = Duration::from_millis(1500);
    f.locker.config().put_class(&delayed).await.unwrap();
    let name = LockName::new(NS2, "delayed", "d/1");

    // Orderly release: granted at once, in one Txn.
    let a = session(&f.locker, 2).await;
    let b = session(&f.locker, 10).await;
    let ha = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    ha.release().await.unwrap();
    let before = revision(f.locker.client()).await;
    let hb = f
        .locker
        .acquire(&b, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert_eq!(token(&hb).revision().get(), (before + 1) as u64);
    hb.release().await.unwrap();

    // Expiry: a waiter is granted no sooner than lock_delay after the hold ended.
    let ha = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let waiter = spawn_waiter(&f.locker, &b, &name, Mode::Exclusive, secs(20)).await;
    let mut holds = PrefixWatch::start(
        f.locker.client(),
        &format!("{ROOT}locks/{NS2}/delayed/d%2F1/h/"),
    )
    .await;
    a.stop_keepalive();
    holds.next(EventType::Delete).await;
    let ended = Instant::now();
    let hb = waiter.await.unwrap().unwrap();
    let waited = ended.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "granted {waited:?} after the expiry"
    );
    assert!(
        // Not the property under test (the lower bound is): only "not stuck".
        waited < Duration::from_millis(5000),
        "granted {waited:?} after the expiry"
    );
    assert!(token(&hb) > token(&ha));
    hb.release().await.unwrap();
    // The expired hold's grant record was consumed by that grant: the next is immediate.
    let before = revision(f.locker.client()).await;
    let hb = f
        .locker
        .acquire(&b, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert_eq!(token(&hb).revision().get(), (before + 1) as u64);
}

#[tokio::test]
async fn etcd_lock_delay_applies_after_force_release() {
    let f = fixture(1).await;
    let mut delayed = class(NS2, "delayed", "d/");
    delayed.lock_delay = Duration::from_millis(1000);
    f.locker.config().put_class(&delayed).await.unwrap();
    let name = LockName::new(NS2, "delayed", "d/f");
    let a = session(&f.locker, 10).await;
    let b = session(&f.locker, 10).await;
    let ha = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let marker = ForceMarker {
        request_id: "fr-2".into(),
        requester: "ops".into(),
        reason: "test".into(),
    };
    f.locker
        .force_release(&name, a.lease(), Mode::Exclusive, &marker)
        .await
        .unwrap();
    let forced = Instant::now();
    let hb = f
        .locker
        .acquire(&b, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let waited = forced.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "granted {waited:?} after the force"
    );
    assert!(
        // Not the property under test (the lower bound is): only "not stuck".
        waited < Duration::from_millis(4000),
        "granted {waited:?} after the force"
    );
    assert!(token(&hb) > token(&ha));
    let missing = f
        .locker
        .force_release(&name, a.lease(), Mode::Exclusive, &marker)
        .await
        .unwrap_err();
    assert!(missing.is_not_held());
}
