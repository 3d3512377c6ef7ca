//! palisade-lock on real etcd members that the test harness starts, one module per
//! concept; the set-up the modules share is in `support`.
//!
//! Every test that starts etcd members has `etcd` in its full name (its own name or its
//! module's): the `test(/etcd/)` filter in `.config/nextest.toml` runs those one at a time,
//! because members started side by side compete for the same cores and disk, and these
//! tests bound how long grants, expiries and lock delays take.

mod bad_input;
mod cancellation;
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

use etcd_client::Client;
use palisade_lock::{
    Epoch, EpochReason, EpochRecord, EpochStore, FencingToken, FileEpochStore, Locker,
    LockerOptions, Mode, Namespace, Revision,
};
use palisade_testkit::{EtcdCluster, RestoreMode};

use support::{
    class, connect, connect_window, fixture, fixture_window, keys_under, lock, revision, secs,
    session, token, Fixture, NS, ROOT,
};

#[tokio::test]
async fn etcd_restore_into_new_cluster_refuses_until_epoch_advanced() {
    let f = fixture(1).await;
    let s = session(&f.locker, 10).await;
    let h = f
        .locker
        .acquire(&s, &lock("r"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    h.release().await.unwrap();
    let snapshot = f.cluster.snapshot().await;
    let mut highest = FencingToken::MIN;
    for key in ["r", "r2", "r3"] {
        let h = f
            .locker
            .acquire(&s, &lock(key), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        highest = highest.max(token(&h));
        h.release().await.unwrap();
    }

    let restored = EtcdCluster::restore(&snapshot, 1).await;
    let locker = connect(restored.endpoints(), &f.dir).await.unwrap();
    let s2 = session(&locker, 10).await;
    let err = locker
        .acquire(&s2, &lock("r"), Mode::Exclusive, secs(5))
        .await
        .unwrap_err();
    assert!(err.is_epoch_mismatch(), "{err:?}");
    let again = locker
        .acquire(&s2, &lock("r"), Mode::Exclusive, secs(5))
        .await
        .unwrap_err();
    assert!(again.is_epoch_mismatch(), "refusal is sticky: {again:?}");
    assert!(keys_under(locker.client(), &format!("{ROOT}locks/"))
        .await
        .is_empty());

    let record = locker.advance_epoch(EpochReason::Restore).await.unwrap();
    assert_eq!(record.epoch.get(), 1);
    assert_eq!(record.cluster_id, restored.cluster_id().await);
    for key in ["r", "r2", "r9"] {
        let h = locker
            .acquire(&s2, &lock(key), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        assert!(
            token(&h) > highest,
            "{} after restore vs {highest} before",
            token(&h)
        );
        assert_eq!(token(&h).epoch().get(), 1);
        h.release().await.unwrap();
    }
    // A second locker on the same records agrees.
    let other = connect(restored.endpoints(), &f.dir).await.unwrap();
    assert_eq!(other.epoch().1, None);
}

#[tokio::test]
async fn etcd_revision_going_backwards_with_same_cluster_id_stops_grants() {
    // A window of 2 revisions: the durable record confirms grants closely, so the
    // restore below goes under the confirmed revision (a restore within the
    // reservation is made harmless instead: see the crash test below).
    let mut f = fixture_window(1, 2).await;
    let s = session(&f.locker, 10).await;
    let h = f
        .locker
        .acquire(&s, &lock("b"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    h.release().await.unwrap();
    let cluster_id = f.cluster.cluster_id().await;
    let snapshot = f.cluster.snapshot().await;
    let mut highest = FencingToken::MIN;
    for _ in 0..5 {
        let h = f
            .locker
            .acquire(&s, &lock("b"), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        highest = highest.max(token(&h));
        h.release().await.unwrap();
    }
    let durable = FileEpochStore::new(f.dir.path().join("epoch.json"))
        .load()
        .await
        .unwrap()
        .unwrap();
    assert!(
        durable.highest_grant_rev.get() > snapshot.revision() as u64,
        "{durable:?} vs snapshot at {}",
        snapshot.revision()
    );
    f.cluster
        .restore_in_place(&snapshot, RestoreMode::SameClusterId)
        .await;
    assert_eq!(f.cluster.cluster_id().await, cluster_id);

    // The running locker: a grant in the restored cluster is refused and undone.
    let s2 = session(&f.locker, 10).await;
    let err = f
        .locker
        .acquire(&s2, &lock("b"), Mode::Exclusive, secs(5))
        .await
        .unwrap_err();
    assert!(err.is_epoch_mismatch(), "{err:?}");
    assert!(keys_under(f.locker.client(), &format!("{ROOT}locks/"))
        .await
        .is_empty());
    // A locker started now on the same durable record refuses too.
    let fresh = connect_window(f.cluster.endpoints(), &f.dir, 2)
        .await
        .unwrap();
    assert!(matches!(
        fresh.epoch().1,
        Some(palisade_lock::EpochMismatch::RevisionBehind { .. })
    ));
    let s3 = session(&fresh, 10).await;
    assert!(fresh
        .acquire(&s3, &lock("b"), Mode::Exclusive, secs(5))
        .await
        .unwrap_err()
        .is_epoch_mismatch());

    fresh.advance_epoch(EpochReason::Restore).await.unwrap();
    let h = fresh
        .acquire(&s3, &lock("b"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert!(token(&h) > highest);
    let fresh_token = token(&h);
    h.release().await.unwrap();
    // The old locker, refusing since it saw the revision go back, adopts the epoch
    // advanced through the fresh one (both records agree on it) without a restart.
    let h = f
        .locker
        .acquire(&s2, &lock("b2"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert_eq!(token(&h).epoch().get(), 1);
    assert!(token(&h) > fresh_token);
    assert_eq!(f.locker.epoch().1, None);
}

#[tokio::test]
async fn etcd_advancing_past_the_last_epoch_is_refused() {
    let f = fixture(1).await;
    let store = FileEpochStore::new(f.dir.path().join("epoch.json"));
    let (mut record, _) = f.locker.epoch();
    record.epoch = Epoch::MAX;
    store.store(record).await.unwrap();
    let locker = connect(f.cluster.endpoints(), &f.dir).await.unwrap();
    assert!(
        locker.epoch().1.is_some(),
        "records disagree: grants refused"
    );
    let err = locker.advance_epoch(EpochReason::Rehome).await.unwrap_err();
    assert!(err.is_epoch_exhausted(), "{err:?}");
    assert!(err.to_string().contains("32767"), "{err}");
    let durable: Option<EpochRecord> = store.load().await.unwrap();
    assert_eq!(durable.unwrap().epoch, Epoch::MAX, "nothing advanced");
}

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

#[tokio::test]
async fn etcd_restart_after_a_crash_moves_etcd_past_the_reservation_before_granting() {
    let window = 1000;
    let mut f = fixture_window(1, window).await;
    let s = session(&f.locker, 10).await;
    let h = f
        .locker
        .acquire(&s, &lock("crash"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    h.release().await.unwrap();
    let snapshot = f.cluster.snapshot().await;
    let mut before = FencingToken::MIN;
    for i in 0..10 {
        let h = f
            .locker
            .acquire(&s, &lock(&format!("crash/{i}")), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        before = before.max(token(&h));
        h.release().await.unwrap();
    }
    let durable = FileEpochStore::new(f.dir.path().join("epoch.json"))
        .load()
        .await
        .unwrap()
        .unwrap();
    // The tokens since the snapshot were handed out inside the reservation and never
    // confirmed: the snapshot is between the confirmed revision and the tokens.
    assert!(durable.highest_grant_rev.get() <= snapshot.revision() as u64);
    assert!(before.revision().get() > snapshot.revision() as u64);
    assert!(durable.reserved_rev >= before.revision());
    // The locker "crashes" (nothing flushed), and etcd is restored with its cluster id:
    // its revision goes back below tokens already handed out.
    drop(s);
    let Fixture {
        ref mut cluster,
        locker,
        ref dir,
    } = f;
    drop(locker);
    cluster
        .restore_in_place(&snapshot, RestoreMode::SameClusterId)
        .await;
    let client = Client::connect(cluster.endpoints(), None).await.unwrap();
    assert!(revision(&client).await < before.revision().get() as i64);

    let restarted = connect_window(cluster.endpoints(), dir, window)
        .await
        .unwrap();
    assert_eq!(
        restarted.epoch().1,
        None,
        "a restore within the reservation is harmless"
    );
    // Before its first grant, etcd's revision is already at the old reservation.
    assert!(revision(&client).await as u64 >= durable.reserved_rev.get());
    let s = session(&restarted, 10).await;
    let mut last = before;
    for key in ["crash", "crash/0", "crash/9"] {
        let h = restarted
            .acquire(&s, &lock(key), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        assert!(token(&h) > last, "{} after {last}", token(&h));
        assert!(token(&h).revision() > durable.reserved_rev);
        last = token(&h);
        h.release().await.unwrap();
    }
}

#[tokio::test]
async fn etcd_replica_that_saw_a_new_cluster_id_adopts_the_epoch_advanced_through_another() {
    let mut f = fixture(1).await;
    let a = f.locker.clone();
    let b = connect(f.cluster.endpoints(), &f.dir).await.unwrap();
    let (sa, sb) = (session(&a, 10).await, session(&b, 10).await);
    let mut old = FencingToken::MIN;
    for (locker, s) in [(&a, &sa), (&b, &sb), (&a, &sa), (&b, &sb)] {
        let h = locker
            .acquire(s, &lock("replica"), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        assert!(token(&h) > old);
        old = token(&h);
        h.release().await.unwrap();
    }
    let snapshot = f.cluster.snapshot().await;
    let old_cluster = f.cluster.cluster_id().await;
    f.cluster
        .restore_in_place(&snapshot, RestoreMode::NewClusterId)
        .await;
    let new_cluster = f.cluster.cluster_id().await;
    assert_ne!(new_cluster, old_cluster);

    // Both replicas refuse (sessions opened in the restored cluster).
    let (sa, sb) = (session(&a, 10).await, session(&b, 10).await);
    for (locker, s) in [(&a, &sa), (&b, &sb)] {
        let err = locker
            .acquire(s, &lock("replica"), Mode::Exclusive, secs(5))
            .await
            .unwrap_err();
        assert!(err.is_epoch_mismatch(), "{err:?}");
    }
    assert!(matches!(
        b.epoch().1,
        Some(palisade_lock::EpochMismatch::ClusterId { actual, .. }) if actual == new_cluster
    ));
    // B keeps refusing while nobody advanced the epoch.
    let err = b
        .acquire(&sb, &lock("replica"), Mode::Exclusive, secs(5))
        .await
        .unwrap_err();
    assert!(err.is_epoch_mismatch(), "{err:?}");
    assert!(keys_under(b.client(), &format!("{ROOT}locks/"))
        .await
        .is_empty());

    // The epoch is advanced through A, which grants under it (raising the reservation).
    let advanced = a.advance_epoch(EpochReason::Restore).await.unwrap();
    assert_eq!(advanced.cluster_id, new_cluster);
    let h = a
        .acquire(&sa, &lock("replica"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let a_token = token(&h);
    assert!(a_token > old);
    h.release().await.unwrap();

    // B adopts it without a restart and grants above every earlier token.
    let h = b
        .acquire(&sb, &lock("replica"), Mode::Exclusive, secs(10))
        .await
        .unwrap_or_else(|e| panic!("B still refuses after the advance: {e:?}"));
    assert_eq!(token(&h).epoch(), advanced.epoch);
    assert!(
        token(&h) > old && token(&h) > a_token,
        "{} vs {old}, {a_token}",
        token(&h)
    );
    h.release().await.unwrap();
    assert_eq!(b.epoch().1, None);
    assert_eq!(b.epoch().0.epoch, advanced.epoch);
    assert_eq!(b.epoch().0.cluster_id, new_cluster);
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
