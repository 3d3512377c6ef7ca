//! Force release through failures: etcd members killed around an approval, and the
//! request table's connection terminated by the server.

use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{LockClass, Namespace};
use palisade_server::testing::ServiceFixture;
use palisade_server::{Authz, AuthzConfig, ForceReleases, ServiceOptions};
use palisade_testkit::TestDb;
use serde_json::{json, Value};

use super::{
    acquire_body, assert_problem, call, open, pool_of, start_replica, Recorded, ADMIN, ADMIN2,
    AUTHZ, OWNER,
};

pub(super) fn force_options(force: ForceReleases) -> ServiceOptions {
    let authz = format!(
        "admins = [\"{ADMIN}\", \"{ADMIN2}\"]\n{}",
        AUTHZ.replace("admins = [\"spiffe://test/ops\"]", "")
    );
    ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(&authz).unwrap()))
        .insecure_dev_identity()
        .with_force_releases(force)
}

async fn request(addr: std::net::SocketAddr, key: &str) -> String {
    let req = json!({ "namespace": "ns", "class": "c", "key": key, "reason": "stuck" });
    let r = call(addr, "POST", "/v1/force-releases", ADMIN, req).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    r.body["id"].as_str().unwrap().to_owned()
}

async fn holders(addr: std::net::SocketAddr, key: &str) -> Value {
    let path = format!("/v1/locks/status?namespace=ns&class=c&key={key}");
    let r = call(addr, "GET", &path, ADMIN, Value::Null).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["holders"].clone()
}

#[tokio::test]
async fn etcd_force_release_survives_a_dead_member_and_a_lost_quorum_executing_once() {
    let mut f = ServiceFixture::start(3, Duration::from_millis(500))
        .await
        .unwrap();
    let mut c = LockClass::new("ns", "c", "");
    c.ttl_max = Duration::from_secs(60);
    f.configure(&Namespace::new("ns", "tenant"), &c)
        .await
        .unwrap();
    let db = TestDb::create().await;
    let recorded = Recorded::default();
    let force = ForceReleases::new(pool_of(&db), Arc::new(recorded.clone()));
    force.migrate().await.unwrap();
    let addr = start_replica(f.locker.clone(), force_options(force))
        .await
        .addr;
    let cluster = &mut f.cluster;

    // Two holds, on k1 and k2, by one session with a long TTL.
    let s = open(addr, OWNER, 60_000).await;
    for key in ["k1", "k2"] {
        let r = call(
            addr,
            "POST",
            "/v1/locks/acquire",
            OWNER,
            acquire_body(&s, key, 1_000),
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let r1 = request(addr, "k1").await;
    let r2 = request(addr, "k2").await;

    // One member dead: the shared retry moves the etcd calls to the others.
    let leader = cluster.leader().await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    cluster.kill(follower);
    let r = call(
        addr,
        "POST",
        &format!("/v1/force-releases/{r1}/approve"),
        ADMIN2,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["released"].as_array().unwrap().len(), 1);
    assert_eq!(holders(addr, "k1").await, json!([]));

    // Quorum lost after the approval is recorded: 503, approved but not executed.
    cluster.kill(leader);
    let approve2 = format!("/v1/force-releases/{r2}/approve");
    let r = call(addr, "POST", &approve2, ADMIN2, Value::Null).await;
    assert_problem(&r, 503, "quorum-lost");
    let pg = db.connect().await;
    let row = pg
        .query_one(
            "SELECT approver, executed_at IS NOT NULL FROM force_release_request WHERE id = $1",
            &[&r2],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some(ADMIN2));
    assert!(!row.get::<_, bool>(1), "not executed");
    assert_eq!(
        recorded.0.lock().unwrap().len(),
        1,
        "only k1's release recorded"
    );

    // Quorum back: approving again executes it, once.
    cluster.restart(follower).await;
    cluster.restart(leader).await;
    let back_by = tokio::time::Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = call(addr, "POST", &approve2, ADMIN2, Value::Null).await;
        if r.status != 503 || tokio::time::Instant::now() > back_by {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["approver"], ADMIN2);
    let released = r.body["released"].as_array().unwrap();
    assert_eq!(released.len(), 1, "{:?}", r.body);
    assert_eq!(released[0]["session"], s.as_str());
    assert_eq!(holders(addr, "k2").await, json!([]));
    let r = call(addr, "POST", &approve2, ADMIN2, Value::Null).await;
    assert_problem(&r, 409, "already-approved");
    let records = recorded.0.lock().unwrap().clone();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records.iter().filter(|r| r.request_id == r2).count(), 1);

    // The session acquires k2 again: a retried approval never touches the new hold.
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k2", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = call(addr, "POST", &approve2, ADMIN2, Value::Null).await;
    assert_problem(&r, 409, "already-approved");
    assert_eq!(holders(addr, "k2").await.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn etcd_force_release_requests_survive_a_terminated_database_connection() {
    let f = ServiceFixture::start(1, Duration::from_millis(500))
        .await
        .unwrap();
    f.configure(
        &Namespace::new("ns", "tenant"),
        &LockClass::new("ns", "c", ""),
    )
    .await
    .unwrap();
    let db = TestDb::create().await;
    let force = ForceReleases::new(pool_of(&db), Arc::new(Recorded::default()));
    force.migrate().await.unwrap();
    let addr = start_replica(f.locker.clone(), force_options(force))
        .await
        .addr;
    let admin = db.connect().await;
    // A request names a hold that exists when it is made.
    let s = open(addr, OWNER, 30_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    let first = request(addr, "k").await;
    for round in 0..3 {
        // The server ends every other connection to the database between requests.
        let killed: i64 = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            killed >= 1,
            "round {round}: the pool's connection was terminated"
        );
        let id = request(addr, "k").await;
        assert_ne!(id, first);
    }
    // And an approval works on the pool too.
    let r = call(
        addr,
        "POST",
        &format!("/v1/force-releases/{first}/approve"),
        ADMIN2,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["released"][0]["session"], s.as_str());
}

/// Replicas starting together migrate the request table at once: every one succeeds.
#[tokio::test]
async fn force_release_migrations_of_replicas_starting_at_once_all_succeed() {
    let db = TestDb::create().await;
    let migrations: Vec<_> = (0..8)
        .map(|_| {
            let force = ForceReleases::new(pool_of(&db), Arc::new(Recorded::default()));
            tokio::spawn(async move { force.migrate().await })
        })
        .collect();
    for m in migrations {
        m.await.unwrap().unwrap();
    }
    let pg = db.connect().await;
    let n: i64 = pg
        .query_one("SELECT count(*) FROM force_release_request", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}
