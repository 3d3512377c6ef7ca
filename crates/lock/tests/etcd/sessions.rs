//! Sessions: closing one releases its holds, its TTL is the one etcd granted, and a
//! detached session is addressed by its lease id from any locker.

use std::time::Duration;

use palisade_lock::{InvalidInput, LockName, LossReason, Mode, Revision, SpiffeId};
use tokio::time::Instant;

use crate::support::{class, connect, fixture, lock, secs, session, spawn_waiter, token, NS2};

#[tokio::test]
async fn etcd_session_close_releases_holds_and_fires_loss() {
    let f = fixture(1).await;
    let s = session(&f.locker, 10).await;
    let h = f
        .locker
        .acquire(&s, &lock("close"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let other = session(&f.locker, 10).await;
    let waiter = spawn_waiter(&f.locker, &other, &lock("close"), Mode::Exclusive, secs(10)).await;
    s.clone().close().await.unwrap();
    assert_eq!(h.lost().await, LossReason::Closed);
    let next = waiter.await.unwrap().unwrap();
    assert!(token(&next) > token(&h));
    assert!(h.release().await.unwrap_err().is_not_held());
    // A closed session cannot acquire.
    assert!(f
        .locker
        .acquire(&s, &lock("x"), Mode::Exclusive, secs(2))
        .await
        .unwrap_err()
        .is_session_lost());
}

#[tokio::test]
async fn etcd_session_ttl_is_what_etcd_granted_and_too_long_a_ttl_is_bad_input() {
    let mut f = fixture(1).await;
    let s = session(&f.locker, 1).await;
    let granted = f
        .locker
        .client()
        .clone()
        .lease_time_to_live(s.lease().get(), None)
        .await
        .unwrap()
        .granted_ttl();
    assert!(granted >= 1);
    assert_eq!(
        s.ttl(),
        Duration::from_secs(granted as u64),
        "the TTL etcd granted"
    );
    // Class bounds are checked against the granted TTL.
    let mut tight = class(NS2, "tight", "t/");
    tight.ttl_min = Duration::from_secs(1);
    tight.ttl_max = Duration::from_secs(granted as u64);
    f.locker.config().put_class(&tight).await.unwrap();
    let h = f
        .locker
        .acquire(
            &s,
            &LockName::new(NS2, "tight", "t/1"),
            Mode::Exclusive,
            secs(5),
        )
        .await
        .unwrap();
    h.release().await.unwrap();

    // Above etcd's MaxLeaseTTL: refused before any etcd call, even with etcd down.
    f.cluster.kill(0);
    for ttl in [9_000_000_001, u64::MAX / 2] {
        let started = Instant::now();
        let err = f
            .locker
            .open_session(
                SpiffeId::new("spiffe://test/worker").unwrap(),
                Duration::from_secs(ttl),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err.invalid_input(), Some(InvalidInput::BadTtl(_))),
            "{err:?}"
        );
        // An etcd call with etcd down would take the whole retry deadline (5 s).
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

#[tokio::test]
async fn etcd_detached_session_by_lease_id() {
    let f = fixture(1).await;
    let owner = SpiffeId::new("spiffe://test/detached").unwrap();
    let record = f
        .locker
        .open_detached_session(owner.clone(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(record.spiffe_id, owner);
    assert_eq!(record.ttl, Duration::from_secs(5));
    // Any locker (another replica) reads the same record.
    let other = connect(f.cluster.endpoints(), &f.dir).await.unwrap();
    assert_eq!(other.session_record(record.lease).await.unwrap(), record);
    assert_eq!(
        other.keep_alive_once(record.lease).await.unwrap(),
        Duration::from_secs(5)
    );
    // Acquire through an attached handle, forget the hold: it stays in etcd.
    let session = f.locker.attach_session(&record);
    let hold = f
        .locker
        .acquire(
            &session,
            &lock("d"),
            Mode::Exclusive,
            Instant::now() + Duration::from_secs(2),
        )
        .await
        .unwrap();
    let rev = hold.grant_rev().unwrap();
    hold.forget();
    drop(session);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state = other.lock_state(&lock("d")).await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].lease, record.lease);
    assert_eq!(state.holders[0].grant_rev, rev);
    // Dropping the attached handle did not revoke the lease.
    other.keep_alive_once(record.lease).await.unwrap();
    // Release by (lock, lease, mode, grant_rev), from the other locker: a wrong grant
    // revision or mode is not held; the right one releases once.
    let wrong = Revision::new(rev.get() + 1);
    assert!(other
        .release_by(&lock("d"), record.lease, Mode::Exclusive, wrong)
        .await
        .unwrap_err()
        .is_not_held());
    assert!(other
        .release_by(&lock("d"), record.lease, Mode::Shared, rev)
        .await
        .unwrap_err()
        .is_not_held());
    other
        .release_by(&lock("d"), record.lease, Mode::Exclusive, rev)
        .await
        .unwrap();
    assert!(other
        .lock_state(&lock("d"))
        .await
        .unwrap()
        .holders
        .is_empty());
    assert!(other
        .release_by(&lock("d"), record.lease, Mode::Exclusive, rev)
        .await
        .unwrap_err()
        .is_not_held());
    // Revoked: the record is gone, keepalive and acquire fail with SessionLost.
    other.revoke_session(record.lease).await.unwrap();
    assert!(f
        .locker
        .session_record(record.lease)
        .await
        .unwrap_err()
        .is_session_lost());
    let e = f.locker.keep_alive_once(record.lease).await.unwrap_err();
    assert!(e.is_session_lost(), "{e:?}");
    assert!(f
        .locker
        .revoke_session(record.lease)
        .await
        .unwrap_err()
        .is_session_lost());
    let session = f.locker.attach_session(&record);
    let err = f
        .locker
        .acquire(
            &session,
            &lock("e"),
            Mode::Exclusive,
            Instant::now() + Duration::from_secs(2),
        )
        .await
        .unwrap_err();
    assert!(err.is_session_lost(), "{err:?}");
    // Bad TTLs write nothing.
    for ttl in [Duration::ZERO, Duration::from_millis(1500)] {
        assert!(matches!(
            f.locker
                .open_detached_session(owner.clone(), ttl)
                .await
                .unwrap_err()
                .invalid_input(),
            Some(InvalidInput::BadTtl(_))
        ));
    }
}
