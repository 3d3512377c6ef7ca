//! Which grants write a grant record (`g/<m>/<lease>`): only those of a class with a
//! lock-delay, also when the grant is a hand-over at release; every session's lease
//! carries its marker (`leases/<lease>`), by which audit tells an expiry from a release.

use std::time::Duration;

use palisade_lock::{LockName, Mode};

use crate::support::{class, fixture, hand_over, keys_under, secs, session, HandedOver, NS2, ROOT};

fn lock_base(ns: &str, class: &str, key: &str) -> String {
    format!("{ROOT}locks/{ns}/{class}/{key}/")
}

#[tokio::test]
async fn etcd_only_a_class_with_a_lock_delay_writes_grant_records() {
    let f = fixture(1).await;
    let plain = class(NS2, "plain", "p/");
    let mut delayed = class(NS2, "delayed", "d/");
    delayed.lock_delay = Duration::from_millis(500);
    for c in [&plain, &delayed] {
        f.locker.config().put_class(c).await.unwrap();
    }
    let a = session(&f.locker, 10).await;
    let lease = a.lease().to_string();
    let markers = keys_under(f.locker.client(), &format!("{ROOT}leases/")).await;
    assert!(
        markers.contains(&format!("{ROOT}leases/{lease}")),
        "the session's lease carries its marker: {markers:?}"
    );

    let p = LockName::new(NS2, "plain", "p/1");
    let hp = f
        .locker
        .acquire(&a, &p, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let base = lock_base(NS2, "plain", "p%2F1");
    assert_eq!(
        keys_under(f.locker.client(), &base).await,
        [format!("{base}h/x/{lease}")]
    );
    hp.release().await.unwrap();
    assert!(keys_under(f.locker.client(), &base).await.is_empty());

    let d = LockName::new(NS2, "delayed", "d/1");
    let hd = f
        .locker
        .acquire(&a, &d, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let base = lock_base(NS2, "delayed", "d%2F1");
    assert_eq!(
        keys_under(f.locker.client(), &base).await,
        [format!("{base}g/x/{lease}"), format!("{base}h/x/{lease}")]
    );
    hd.release().await.unwrap();
    assert!(keys_under(f.locker.client(), &base).await.is_empty());
}

#[tokio::test]
async fn etcd_a_hand_over_writes_the_waiters_grant_record_only_with_a_lock_delay() {
    let f = fixture(1).await;
    let mut delayed = class(NS2, "delayed", "d/");
    delayed.lock_delay = Duration::from_millis(500);
    f.locker.config().put_class(&delayed).await.unwrap();
    let name = LockName::new(NS2, "delayed", "d/h");
    let base = lock_base(NS2, "delayed", "d%2Fh");
    // B's release hands over to C in one revision, with C's grant record, since the
    // class has a lock-delay.
    let HandedOver {
        c, hc, released_at, ..
    } = hand_over(&f.locker, &name, &base).await;
    assert_eq!(hc.grant_rev().unwrap().as_i64(), released_at);
    let lease = c.lease().to_string();
    assert_eq!(
        keys_under(f.locker.client(), &base).await,
        [format!("{base}g/x/{lease}"), format!("{base}h/x/{lease}")]
    );
    hc.release().await.unwrap();
    assert!(keys_under(f.locker.client(), &base).await.is_empty());
}
