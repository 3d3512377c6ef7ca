//! A durable epoch store that cannot be written is the operator's outage: an acquire
//! whose token needs a store write answers 503 `epoch-store-unavailable` with
//! `Retry-After`, not 500 `internal`, and grants again once the store is back.

use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{LockClass, Locker, LockerOptions, Namespace, PostgresEpochStore};
use palisade_testkit::{EtcdCluster, TestDb};

use super::{acquire_body, assert_problem, call, open, options, start_replica, OWNER};

#[tokio::test]
async fn etcd_a_broken_postgres_epoch_store_answers_503_with_retry_after() {
    let cluster = EtcdCluster::start(1).await;
    let db = TestDb::create().await;
    let store = PostgresEpochStore::new(Arc::new(db.connect().await), "/palisade/");
    store.migrate().await.unwrap();
    // Window 0: every grant past the last reservation writes the durable record before
    // its token is handed out, so each acquire below needs the store.
    let locker = Locker::connect(
        LockerOptions::new(cluster.endpoints())
            .with_request_timeout(Duration::from_millis(500))
            .with_epoch_window(0),
        store,
    )
    .await
    .unwrap();
    let mut class = LockClass::new("ns", "c", "");
    class.ttl_max = Duration::from_secs(30);
    locker
        .config()
        .put_namespace(&Namespace::new("ns", "tenant"))
        .await
        .unwrap();
    locker.config().put_class(&class).await.unwrap();
    let replica = start_replica(locker, options()).await;
    let addr = replica.addr;
    let session = open(addr, OWNER, 10_000).await;
    let acquire = |key: &'static str| {
        let body = acquire_body(&session, key, 2_000);
        async move { call(addr, "POST", "/v1/locks/acquire", OWNER, body).await }
    };
    let granted = acquire("before").await;
    assert_eq!(granted.status, 200, "{:?}", granted.body);

    // The operator's database loses the table (a bad migration, a restore gone wrong):
    // the store's writes fail with "relation does not exist".
    let admin = db.connect().await;
    admin
        .batch_execute("ALTER TABLE lock_epoch RENAME TO lock_epoch_away")
        .await
        .unwrap();
    let refused = acquire("during").await;
    assert_problem(&refused, 503, "epoch-store-unavailable");
    assert_eq!(refused.retry_after, Some(2), "{:?}", refused.body);
    assert_eq!(refused.body["title"], "epoch-store-unavailable");
    assert!(
        refused.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("durable epoch record")),
        "{:?}",
        refused.body
    );

    // The store is back: the same lock is granted (the refused grant left nothing that
    // blocks it), with a token above the one before.
    admin
        .batch_execute("ALTER TABLE lock_epoch_away RENAME TO lock_epoch")
        .await
        .unwrap();
    let again = acquire("during").await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    let token = |r: &super::Resp| r.body["token"].as_str().unwrap().parse::<u64>().unwrap();
    assert!(token(&again) > token(&granted), "{:?}", again.body);
    replica.stop();
}
