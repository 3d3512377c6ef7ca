//! Bad input is a typed `InvalidInput`, refused before anything is written to etcd.

use std::time::Duration;

use palisade_lock::{
    Error, ErrorKind, FileEpochStore, InvalidInput, LockName, Locker, LockerOptions, Mode,
};

use crate::support::{class, fixture, lock, revision, secs, session, NS, NS2};

#[tokio::test]
async fn etcd_bad_input_is_typed_and_writes_nothing() {
    let f = fixture(1).await;
    let mut strict = class(NS2, "strict", "s/");
    strict.ttl_min = Duration::from_secs(5);
    strict.ttl_max = Duration::from_secs(10);
    f.locker.config().put_class(&strict).await.unwrap();
    let s = session(&f.locker, 2).await;
    let c = f.locker.client().clone();
    let before = revision(&c).await;

    let reason = |e: Error| match e.kind() {
        ErrorKind::InvalidInput(r) => r.clone(),
        other => panic!("expected invalid input, got {other:?}"),
    };
    let try_lock = |name: LockName| {
        let (l, s) = (f.locker.clone(), s.clone());
        async move {
            l.acquire(&s, &name, Mode::Exclusive, secs(2))
                .await
                .map(drop)
                .unwrap_err()
        }
    };
    assert_eq!(reason(try_lock(lock("")).await), InvalidInput::EmptyKey);
    assert_eq!(
        reason(try_lock(lock("a/../b")).await),
        InvalidInput::DotDotSegment
    );
    assert_eq!(
        reason(try_lock(lock("a\0b")).await),
        InvalidInput::ControlCharacter
    );
    assert_eq!(
        reason(try_lock(LockName::new("nope", "c", "k")).await),
        InvalidInput::UnknownNamespace("nope".into())
    );
    assert_eq!(
        reason(try_lock(LockName::new(NS, "nope", "k")).await),
        InvalidInput::UnknownClass("nope".into())
    );
    assert!(matches!(
        reason(try_lock(LockName::new(NS2, "strict", "s/k")).await),
        InvalidInput::TtlOutOfBounds { .. }
    ));
    assert!(matches!(
        reason(try_lock(LockName::new(NS2, "strict", "k")).await),
        InvalidInput::KeyOutsideClass { .. }
    ));
    assert!(matches!(
        reason(try_lock(LockName::new("Bad", "c", "k")).await),
        InvalidInput::BadName(_)
    ));

    let mut inverted = class(NS2, "inv", "inv/");
    inverted.ttl_min = Duration::from_secs(9);
    inverted.ttl_max = Duration::from_secs(3);
    assert!(matches!(
        reason(f.locker.config().put_class(&inverted).await.unwrap_err()),
        InvalidInput::TtlBoundsInverted { .. }
    ));
    assert_eq!(
        reason(
            f.locker
                .config()
                .put_class(&class(NS2, "overlap", "s/x"))
                .await
                .unwrap_err()
        ),
        InvalidInput::PrefixOverlap {
            other: "strict".into()
        }
    );
    let mut orphan = class(NS2, "orphan", "o/");
    orphan.ns_id = "missing".into();
    assert_eq!(
        reason(f.locker.config().put_class(&orphan).await.unwrap_err()),
        InvalidInput::UnknownNamespace("missing".into())
    );

    assert_eq!(revision(&c).await, before, "nothing was written to etcd");
}

#[tokio::test]
async fn an_epoch_window_above_the_maximum_is_bad_input_before_any_etcd_call() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1: the window is refused before connecting.
    let options = LockerOptions::new(["http://127.0.0.1:1"])
        .with_epoch_window(palisade_lock::MAX_EPOCH_WINDOW + 1);
    let err = Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json")))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::InvalidInput(InvalidInput::EpochWindowTooLarge {
            window: palisade_lock::MAX_EPOCH_WINDOW + 1,
            max: palisade_lock::MAX_EPOCH_WINDOW,
        })
    );
    assert!(!dir.path().join("epoch.json").exists());
}
