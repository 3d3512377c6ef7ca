//! palisade-lock on real etcd members that the test harness starts, one module per
//! concept; the set-up the modules share is in `support`.
//!
//! Every test that starts etcd members has `etcd` in its full name (its own name or its
//! module's): the `test(/etcd/)` filter in `.config/nextest.toml` runs those one at a time,
//! because members started side by side compete for the same cores and disk, and these
//! tests bound how long grants, expiries and lock delays take.

mod bad_input;
mod cancellation;
mod epochs;
mod lease_loss;
mod lock_delay;
mod quorum_loss;
mod release_and_handover;
mod sessions;
mod shared_mode;
mod stray_keys;
mod support;
mod tokens_and_fifo;

use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{
    Epoch, EpochReason, EpochRecord, EpochStore, FencingToken, FileEpochStore, Locker,
    LockerOptions, Mode, Namespace, Revision,
};
use palisade_testkit::EtcdCluster;

use support::{class, connect, fixture, lock, secs, session, token, NS, ROOT};

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

#[cfg(feature = "postgres")]
async fn pg_locker(
    cluster: &EtcdCluster,
    db: &palisade_testkit::TestDb,
) -> (Locker, palisade_lock::PostgresEpochStore) {
    let client = db.connect().await;
    let store = palisade_lock::PostgresEpochStore::new(Arc::new(client), ROOT);
    store.migrate().await.unwrap();
    let options =
        LockerOptions::new(cluster.endpoints()).with_request_timeout(Duration::from_millis(500));
    (
        Locker::connect(options, store.clone()).await.unwrap(),
        store,
    )
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn etcd_two_lockers_sharing_a_postgres_epoch_store_both_grant_increasing_tokens() {
    let cluster = EtcdCluster::start(1).await;
    let db = palisade_testkit::TestDb::create().await;
    // The first locker bootstraps the empty key space (database first, then etcd); the
    // second, a separate locker with its own connection, finds both records agreeing.
    let (a, store) = pg_locker(&cluster, &db).await;
    let (b, _) = pg_locker(&cluster, &db).await;
    a.config()
        .put_namespace(&Namespace::new(NS, "tenant"))
        .await
        .unwrap();
    a.config().put_class(&class(NS, "c", "")).await.unwrap();
    assert_eq!(a.epoch().1, None, "{:?}", a.epoch());
    assert_eq!(b.epoch().1, None, "{:?}", b.epoch());
    let (sa, sb) = (session(&a, 10).await, session(&b, 10).await);
    let name = lock("pg-shared");
    let mut last = None;
    for _ in 0..10 {
        for (locker, s) in [(&a, &sa), (&b, &sb)] {
            let h = locker
                .acquire(s, &name, Mode::Exclusive, secs(5))
                .await
                .unwrap();
            assert!(
                Some(token(&h)) > last,
                "tokens strictly increase across lockers"
            );
            last = Some(token(&h));
            h.release().await.unwrap();
        }
    }
    // Concurrent grants from both: no store error, and the record is the max.
    let mut tasks = Vec::new();
    for (i, locker) in [a.clone(), b.clone()].into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let s = session(&locker, 10).await;
            let mut max = 0;
            for j in 0..40 {
                let h = locker
                    .acquire(&s, &lock(&format!("pg/{i}/{j}")), Mode::Exclusive, secs(10))
                    .await
                    .unwrap();
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
    let durable = store.load().await.unwrap().unwrap();
    assert!(durable.reserved_rev.get() >= max, "{durable:?} vs {max}");
    assert!(
        durable.highest_grant_rev.get() <= max,
        "{durable:?} vs {max}"
    );
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

#[cfg(feature = "postgres")]
#[tokio::test]
async fn pg_epoch_store_reads_rows_from_before_the_reservation_and_max_merges_it() {
    let db = palisade_testkit::TestDb::create().await;
    let client = Arc::new(db.connect().await);
    // The table as the first migration made it, with rows written then.
    client
        .batch_execute(include_str!("../../migrations/0001_lock_epoch.sql"))
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO lock_epoch (root, epoch, cluster_id, advanced_at_ms, reason, highest_grant_rev) \
             VALUES ('/old/', 2, 7, 5, 'restore', 40), ('/old2/', 2, 7, 5, 'restore', 40)",
        )
        .await
        .unwrap();
    let store = palisade_lock::PostgresEpochStore::new(client.clone(), "/old/");
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // idempotent
    let old = store.load().await.unwrap().unwrap();
    assert_eq!(old.epoch.get(), 2);
    assert_eq!(old.highest_grant_rev, Revision::new(40));
    assert_eq!(
        old.reserved_rev,
        Revision::new(40),
        "no reservation: the confirmed one"
    );

    let mut r = old.clone();
    r.highest_grant_rev = Revision::new(50);
    r.reserved_rev = Revision::new(300);
    store.store(r.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap().unwrap(), r);
    // Lower values of the same epoch change nothing.
    let mut lower = r.clone();
    lower.highest_grant_rev = Revision::new(45);
    lower.reserved_rev = Revision::new(100);
    store.store(lower).await.unwrap();
    assert_eq!(store.load().await.unwrap().unwrap(), r);
    // A higher epoch replaces both.
    let mut next = r.clone();
    next.epoch = Epoch::new(3).unwrap();
    next.highest_grant_rev = Revision::new(10);
    next.reserved_rev = Revision::new(10);
    store.store(next.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap().unwrap(), next);

    // An old row (NULL reservation) merged with a lower reservation keeps its confirmed
    // revision as the reservation.
    let store2 = palisade_lock::PostgresEpochStore::new(client.clone(), "/old2/");
    let mut low = old.clone();
    low.highest_grant_rev = Revision::new(30);
    low.reserved_rev = Revision::new(35);
    store2.store(low).await.unwrap();
    let merged = store2.load().await.unwrap().unwrap();
    assert_eq!(merged.highest_grant_rev, Revision::new(40));
    assert_eq!(merged.reserved_rev, Revision::new(40));
}
