//! Epoch advances in the audit trail, against real etcd and PostgreSQL: each advance
//! (restore, rehome) stored once by the tailer of its cluster, across restarts and a full
//! re-read; a rehome between two tiers, its switch naming the namespace and tiers, and
//! the lock timeline showing the advance where it cut the history. Every test here starts
//! etcd.

use std::time::Duration;

use palisade_audit::dashboard::router;
use palisade_audit::{ClusterId, Tailer};
use palisade_lock::{
    EpochReason, EpochRecord, FileEpochStore, LockClass, LockName, Locker, LockerOptions, Mode,
    Namespace, SpiffeId, Tiers,
};
use palisade_testkit::EtcdCluster;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::common::{eventually, get, migrated_db};
use crate::tailer_etcd::{fixture, Fixture, CLASS, NS, ROOT};

/// One `epoch_event` row.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    revision: i64,
    epoch: i32,
    reason: String,
    epoch_cluster_id: i64,
    advanced_at_ms: i64,
    start_revision: i64,
}

async fn epoch_rows(client: &tokio_postgres::Client, cluster: ClusterId) -> Vec<Row> {
    client
        .query(
            "SELECT revision, epoch, reason, epoch_cluster_id, \
                    (extract(epoch FROM advanced_at) * 1000)::bigint, start_revision \
             FROM epoch_event WHERE cluster_id = $1 ORDER BY revision",
            &[&cluster.to_sql()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Row {
            revision: r.get(0),
            epoch: r.get(1),
            reason: r.get(2),
            epoch_cluster_id: r.get(3),
            advanced_at_ms: r.get(4),
            start_revision: r.get(5),
        })
        .collect()
}

/// The row an epoch record written at `revision` must be stored as.
fn row_of(record: &EpochRecord, revision: i64) -> Row {
    Row {
        revision,
        epoch: i32::from(record.epoch.get()),
        reason: palisade_audit::reason_str(record.reason).to_owned(),
        epoch_cluster_id: ClusterId(record.cluster_id).to_sql(),
        advanced_at_ms: record.advanced_at_ms as i64,
        start_revision: record.highest_grant_rev.as_i64(),
    }
}

/// The cluster's current epoch record as etcd holds it, and the revision that wrote it.
async fn etcd_epoch(locker: &Locker) -> (EpochRecord, i64) {
    let mut client = locker.client().clone();
    let resp = client
        .get(format!("{ROOT}config/epoch"), None)
        .await
        .unwrap();
    let kv = &resp.kvs()[0];
    (
        serde_json::from_slice(kv.value()).unwrap(),
        kv.mod_revision(),
    )
}

/// Waits until the cluster has `n` epoch rows.
async fn wait_epoch_rows(fx: &Fixture, n: usize) {
    let client = std::sync::Arc::new(fx.db.connect().await);
    let cluster = fx.cluster;
    eventually(&format!("{n} epoch rows"), || {
        let client = client.clone();
        async move { epoch_rows(&client, cluster).await.len() >= n }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tailer_stores_each_epoch_advance_once_with_its_reason() {
    let fx = fixture().await;
    let (bootstrap, bootstrap_rev) = etcd_epoch(&fx.locker).await;
    assert_eq!(bootstrap.reason, EpochReason::Bootstrap);
    let tailer = fx.start_tailer();
    fx.cycles("a", "ep/1", 2).await;
    let advanced = fx.locker.advance_epoch(EpochReason::Restore).await.unwrap();
    let (restore, restore_rev) = etcd_epoch(&fx.locker).await;
    assert_eq!(restore, advanced);
    let tokens = fx.cycles("b", "ep/1", 1).await;
    assert_eq!(tokens[0] >> 48, 1, "the lock's tokens carry the new epoch");
    // The last change of this history: an advance with no lock event after it, so the
    // tailer's position stays before it and a restart reads it again.
    let advanced = fx.locker.advance_epoch(EpochReason::Rehome).await.unwrap();
    let (rehome, rehome_rev) = etcd_epoch(&fx.locker).await;
    assert_eq!(rehome, advanced);
    wait_epoch_rows(&fx, 3).await;
    tailer.abort();
    let _ = tailer.await;

    let client = fx.db.connect().await;
    let expected = vec![
        row_of(&bootstrap, bootstrap_rev),
        row_of(&restore, restore_rev),
        row_of(&rehome, rehome_rev),
    ];
    assert_eq!(epoch_rows(&client, fx.cluster).await, expected);
    assert_eq!(
        (expected[1].epoch, expected[1].reason.as_str()),
        (1, "restore")
    );
    assert_eq!(
        (expected[2].epoch, expected[2].reason.as_str()),
        (2, "rehome")
    );
    assert!(expected
        .iter()
        .all(|r| r.epoch_cluster_id == fx.cluster.to_sql()));

    // A restart reads the last advance again (it is past the position): stored once.
    let tailer = fx.start_tailer();
    fx.wait_caught_up().await;
    tailer.abort();
    let _ = tailer.await;
    assert_eq!(epoch_rows(&client, fx.cluster).await, expected);

    // The whole history read again from the start: still one row per advance.
    client
        .batch_execute(
            "DELETE FROM audit_cursor; DELETE FROM audit_event; DELETE FROM audit_history",
        )
        .await
        .unwrap();
    let tailer = fx.start_tailer();
    fx.wait_caught_up().await;
    tailer.abort();
    let _ = tailer.await;
    assert_eq!(epoch_rows(&client, fx.cluster).await, expected);
    let grants: i64 = client
        .query_one("SELECT count(*) FROM audit_event WHERE type = 'grant'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(grants, 3, "the lock events were read again too");
}

/// One tier: an etcd cluster and a locker on it.
struct Tier {
    etcd: EtcdCluster,
    locker: Locker,
    _dir: tempfile::TempDir,
}

async fn tier() -> Tier {
    let etcd = EtcdCluster::single().await;
    let dir = tempfile::tempdir().unwrap();
    let options = LockerOptions::new(etcd.endpoints()).with_request_timeout(Duration::from_secs(2));
    let locker = Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json")))
        .await
        .unwrap();
    Tier {
        etcd,
        locker,
        _dir: dir,
    }
}

fn start_tailer(locker: &Locker, pool: &deadpool_postgres::Pool) -> JoinHandle<()> {
    let tailer = Tailer::new(locker.client().clone(), pool.clone())
        .with_root(ROOT)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(200));
    tokio::spawn(async move {
        let _ = tailer.run().await;
    })
}

/// A grant and release of `key` on `locker`; the token.
async fn cycle(locker: &Locker, who: &str, key: &str) -> u64 {
    let session = locker
        .open_session(
            SpiffeId::new(format!("spiffe://acme/{who}")).unwrap(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let hold = locker
        .acquire(
            &session,
            &LockName::new(NS, CLASS, key),
            Mode::Exclusive,
            Instant::now() + Duration::from_secs(10),
        )
        .await
        .unwrap();
    let token = hold.token().unwrap().get();
    hold.release().await.unwrap();
    session.close().await.unwrap();
    token
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rehome_is_recorded_with_its_namespace_and_cuts_the_lock_timeline() {
    let (home, second) = (tier().await, tier().await);
    let mut ns = Namespace::new(NS, "acme");
    ns.cluster_tier = "home".into();
    home.locker.config().put_namespace(&ns).await.unwrap();
    let mut class = LockClass::new(NS, CLASS, "");
    class.ttl_min = Duration::from_secs(1);
    class.ttl_max = Duration::from_secs(30);
    home.locker.config().put_class(&class).await.unwrap();
    let tiers = Tiers::new(
        "home",
        [
            ("home".to_owned(), home.locker.clone()),
            ("second".to_owned(), second.locker.clone()),
        ],
    )
    .unwrap();
    let (db, pool) = migrated_db().await;
    let tailers = [
        start_tailer(&home.locker, &pool),
        start_tailer(&second.locker, &pool),
    ];
    let before = cycle(&home.locker, "a", "inv/7").await;
    // The home tier's rows stored first, so the timeline's cluster order is the move's.
    let client = std::sync::Arc::new(db.connect().await);
    eventually("the home tier's release", || {
        let client = client.clone();
        async move {
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM audit_event WHERE type = 'release'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            n == 1
        }
    })
    .await;
    let moved = tiers
        .rehome(NS, "second", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((moved.from.as_str(), moved.to.as_str()), ("home", "second"));
    let epoch = moved.epoch.epoch.get();
    assert!(epoch >= 1);
    let after = cycle(&second.locker, "b", "inv/7").await;
    assert!(after > before && after >> 48 == u64::from(epoch));
    let home_cluster = ClusterId(home.etcd.cluster_id().await);
    let second_cluster = ClusterId(second.etcd.cluster_id().await);

    eventually("the rehome's advance, switch and second grant", || {
        let client = client.clone();
        async move {
            let n = |sql: &'static str| {
                let client = client.clone();
                async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
            };
            n("SELECT count(*) FROM epoch_event WHERE reason = 'rehome'").await == 1
                && n("SELECT count(*) FROM rehome_event").await == 1
                && n("SELECT count(*) FROM audit_event WHERE type = 'release'").await == 2
        }
    })
    .await;
    for t in tailers {
        t.abort();
    }
    let advance = client
        .query_one(
            "SELECT cluster_id, epoch, epoch_cluster_id FROM epoch_event WHERE reason = 'rehome'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            advance.get::<_, i64>(0),
            advance.get::<_, i32>(1),
            advance.get::<_, i64>(2)
        ),
        (
            second_cluster.to_sql(),
            i32::from(epoch),
            second_cluster.to_sql()
        ),
        "stored by the new tier's tailer, naming its cluster"
    );
    let switch = client
        .query_one(
            "SELECT cluster_id, namespace, from_tier, to_tier, epoch FROM rehome_event",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            switch.get::<_, i64>(0),
            switch.get::<_, String>(1),
            switch.get::<_, String>(2),
            switch.get::<_, String>(3),
            switch.get::<_, i32>(4)
        ),
        (
            home_cluster.to_sql(),
            NS.to_owned(),
            "home".to_owned(),
            "second".to_owned(),
            i32::from(epoch)
        ),
        "stored by the home tier's tailer"
    );

    let app = router(pool.clone());
    let timeline = json(
        &get(&app, "/api/locks?key=orders%2Frows%2Finv%2F7")
            .await
            .body,
    );
    let events = timeline["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["release", "grant", "epoch", "release", "grant"],
        "newest first, the rehome's advance between the tiers' cycles: {timeline}"
    );
    assert_eq!(events[1]["token"].as_str(), Some(&*after.to_string()));
    assert_eq!(events[4]["token"].as_str(), Some(&*before.to_string()));
    let e = &events[2];
    assert_eq!(e["cluster_id"], second_cluster.to_string());
    assert_eq!(e["epoch"]["epoch"].as_u64(), Some(u64::from(epoch)));
    assert_eq!(e["epoch"]["reason"], "rehome");
    assert_eq!(e["epoch"]["namespace"], NS);
    assert_eq!(e["epoch"]["from_tier"], "home");
    assert_eq!(e["epoch"]["to_tier"], "second");

    let page = get(&app, "/locks?key=orders%2Frows%2Finv%2F7").await.body;
    let text = format!(
        "Epoch advanced to {epoch} (rehome: namespace {NS} moved from tier home to tier second)."
    );
    assert_eq!(page.matches(&text).count(), 1, "{page}");
    assert_eq!(page.matches("<tr class=\"epoch\">").count(), 1, "{page}");
    drop((home, second));
}
