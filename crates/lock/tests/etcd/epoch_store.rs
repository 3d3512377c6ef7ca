//! Lockers sharing a file epoch store, and the reservation: every token is covered by the
//! durable reservation, which is raised in steps rather than written for each grant.

use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{
    EpochReason, EpochRecord, EpochStore, FencingToken, FileEpochStore, Locker, LockerOptions,
    Mode, Namespace,
};
use palisade_testkit::EtcdCluster;

use crate::support::{class, connect, fixture, lock, secs, session, token, NS};

#[tokio::test]
async fn etcd_two_lockers_sharing_a_file_store_grant_without_store_errors() {
    let f = fixture(1).await;
    // A second locker on the same etcd and the same epoch file.
    let other = connect(f.cluster.endpoints(), &f.dir).await.unwrap();
    assert_eq!(other.epoch().1, None);
    let mut tasks = Vec::new();
    for (i, locker) in [f.locker.clone(), other.clone()].into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let s = session(&locker, 10).await;
            let mut max = 0;
            for j in 0..80 {
                let name = lock(&format!("shared-store/{i}/{j}"));
                let h = locker
                    .acquire(&s, &name, Mode::Exclusive, secs(10))
                    .await
                    .expect("no epoch store error");
                max = max.max(token(&h).revision().get());
                h.release().await.unwrap();
            }
            max
        }));
    }
    let mut max = 0;
    for t in tasks {
        max = max.max(t.await.unwrap());
    }
    let durable = FileEpochStore::new(f.dir.path().join("epoch.json"))
        .load()
        .await
        .unwrap()
        .unwrap();
    // Every token is covered by the reservation; the confirmed revision lags.
    assert!(durable.reserved_rev.get() >= max, "{durable:?} vs {max}");
    assert!(
        durable.highest_grant_rev.get() <= max,
        "{durable:?} vs {max}"
    );
}

#[tokio::test]
async fn etcd_locker_adopts_an_epoch_advanced_by_another_locker_sharing_its_store() {
    let f = fixture(1).await;
    let b = &f.locker;
    let s = session(b, 10).await;
    let mut old = Vec::new();
    for i in 0..3 {
        let h = b
            .acquire(&s, &lock(&format!("adopt/{i}")), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        old.push(token(&h));
        h.release().await.unwrap();
    }
    let a = connect(f.cluster.endpoints(), &f.dir).await.unwrap();
    let advanced = a.advance_epoch(EpochReason::Restore).await.unwrap();
    assert_eq!(advanced.epoch.get(), 1);
    // B keeps granting, under the new epoch, above every old token; so does A.
    let max_old = *old.iter().max().unwrap();
    let mut last = max_old;
    for i in 0..3 {
        for (locker, who) in [(b, "b"), (&a, "a")] {
            let s = session(locker, 10).await;
            let h = locker
                .acquire(&s, &lock(&format!("adopt/{i}")), Mode::Exclusive, secs(5))
                .await
                .unwrap_or_else(|e| panic!("{who} refused after the advance: {e:?}"));
            assert_eq!(token(&h).epoch(), advanced.epoch, "{who}");
            assert!(token(&h) > last, "{who}");
            last = token(&h);
            h.release().await.unwrap();
        }
    }
    assert_eq!(b.epoch().1, None);
    assert_eq!(b.epoch().0.epoch, advanced.epoch);
}

/// A [`FileEpochStore`] that counts its writes.
struct CountingStore {
    inner: FileEpochStore,
    writes: Arc<std::sync::atomic::AtomicUsize>,
}

impl EpochStore for CountingStore {
    fn load(
        &self,
    ) -> palisade_lock::BoxFuture<'_, Result<Option<EpochRecord>, palisade_lock::StoreError>> {
        self.inner.load()
    }
    fn store(
        &self,
        record: EpochRecord,
    ) -> palisade_lock::BoxFuture<'_, Result<(), palisade_lock::StoreError>> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.store(record)
    }
}

#[tokio::test]
async fn etcd_sequential_grants_inside_the_reservation_cost_few_durable_writes() {
    use std::sync::atomic::Ordering;
    let cluster = EtcdCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("epoch.json");
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store = CountingStore {
        inner: FileEpochStore::new(&path),
        writes: writes.clone(),
    };
    let window = 200;
    let options = LockerOptions::new(cluster.endpoints())
        .with_request_timeout(Duration::from_millis(500))
        .with_epoch_window(window);
    let locker = Locker::connect(options, store).await.unwrap();
    locker
        .config()
        .put_namespace(&Namespace::new(NS, "tenant"))
        .await
        .unwrap();
    locker
        .config()
        .put_class(&class(NS, "c", ""))
        .await
        .unwrap();
    let s = session(&locker, 10).await;
    let at_start = writes.load(Ordering::SeqCst);
    let durable = FileEpochStore::new(&path);
    let grants = 300;
    let mut last = FencingToken::MIN;
    for i in 0..grants {
        let h = locker
            .acquire(
                &s,
                &lock(&format!("seq/{}", i % 7)),
                Mode::Exclusive,
                secs(5),
            )
            .await
            .unwrap();
        let t = token(&h);
        assert!(t > last, "{t} after {last}");
        last = t;
        // The token was handed out only once the durable reservation covered it.
        let record = durable.load().await.unwrap().unwrap();
        assert!(
            record.reserved_rev >= t.revision(),
            "token {t} above the durable reservation {record:?}"
        );
        h.release().await.unwrap();
    }
    // 300 cycles are 600 revisions: the reservation was raised (a write per half
    // window at most), far fewer times than there were grants.
    let during = writes.load(Ordering::SeqCst) - at_start;
    assert!(
        (2..=grants / 20).contains(&during),
        "{grants} grants took {during} durable writes"
    );
}
