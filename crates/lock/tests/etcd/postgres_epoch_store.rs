//! The PostgreSQL epoch store: lockers sharing it grant increasing tokens, and rows from
//! before the reservation column are read and max-merged.

use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{Epoch, EpochStore, Locker, LockerOptions, Mode, Namespace, Revision};
use palisade_testkit::EtcdCluster;

use crate::support::{class, lock, secs, session, token, NS, ROOT};

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

#[tokio::test]
async fn etcd_tiers_sharing_a_database_keep_one_postgres_epoch_record_each() {
    let (a, b) = (EtcdCluster::start(1).await, EtcdCluster::start(1).await);
    let db = palisade_testkit::TestDb::create().await;
    let store = |tier: &'static str| {
        let db = &db;
        async move {
            let s = palisade_lock::PostgresEpochStore::for_tier(
                Arc::new(db.connect().await),
                ROOT,
                tier,
            );
            s.migrate().await.unwrap();
            s
        }
    };
    let options = |c: &EtcdCluster| {
        LockerOptions::new(c.endpoints()).with_request_timeout(Duration::from_millis(500))
    };
    let la = Locker::connect(options(&a), store("a").await)
        .await
        .unwrap();
    let lb = Locker::connect(options(&b), store("b").await)
        .await
        .unwrap();
    let tiers =
        palisade_lock::Tiers::new("a", [("a".to_owned(), la), ("b".to_owned(), lb)]).unwrap();
    tiers
        .advance_epoch("a", palisade_lock::EpochReason::Restore)
        .await
        .unwrap();
    let rb = tiers
        .advance_epoch("b", palisade_lock::EpochReason::Rehome)
        .await
        .unwrap();
    assert_eq!(rb.epoch.get(), 2);
    // Each row names its own cluster: a restart of either tier finds its records agreeing.
    let (ra, rb) = (
        store("a").await.load().await.unwrap().unwrap(),
        store("b").await.load().await.unwrap().unwrap(),
    );
    assert_eq!((ra.epoch.get(), rb.epoch.get()), (1, 2));
    assert_eq!(ra.cluster_id, a.cluster_id().await);
    assert_eq!(rb.cluster_id, b.cluster_id().await);
    let again = Locker::connect(options(&a), store("a").await)
        .await
        .unwrap();
    assert_eq!(again.epoch().1, None, "{:?}", again.epoch());
}
