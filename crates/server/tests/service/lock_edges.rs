//! Lock semantics at the edges: a force release bound to the grant it names (and its
//! holder told), try-acquire, quota slots freed only with their hold, sessions limited
//! per identity, and the TTL etcd granted.

use std::sync::Arc;
use std::time::Duration;

use palisade_client::{Client, HoldLoss, Mode};
use palisade_lock::{LockClass, Namespace};
use palisade_server::{Authz, AuthzConfig, ForceReleases, ServiceOptions};
use palisade_testkit::TestDb;
use serde_json::{json, Value};

use super::force_retry::force_options;
use super::{
    acquire_body, assert_problem, call, fixture, keys, open, pool_of, slots, start_replica,
    Recorded, ADMIN, ADMIN2, AUTHZ, OTHER, OWNER,
};

const STATUS: &str = "/v1/locks/status?namespace=ns&class=c&key=k";

fn release_body(session: &str, key: &str, grant_rev: &Value) -> Value {
    json!({ "session": session, "namespace": "ns", "class": "c", "key": key,
            "mode": "exclusive", "grant_rev": grant_rev })
}

#[tokio::test]
async fn etcd_force_release_deletes_only_the_grant_it_names_and_the_holder_is_told() {
    let f = fixture(0).await;
    let db = TestDb::create().await;
    let recorded = Recorded::default();
    let force = ForceReleases::new(pool_of(&db), Arc::new(recorded.clone()));
    force.migrate().await.unwrap();
    let addr = start_replica(f.connect().await.unwrap(), force_options(force))
        .await
        .addr;

    let s = open(addr, OWNER, 30_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let (t1, g1) = (r.body["token"].clone(), r.body["grant_rev"].clone());

    // A request names the holds at request time; one naming a grant that does not exist,
    // or a key nobody holds, is refused and nothing is requested.
    let req = |extra: Value| {
        let mut b = json!({ "namespace": "ns", "class": "c", "key": "k", "reason": "stuck" });
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let r = call(addr, "POST", "/v1/force-releases", ADMIN, req(json!({}))).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["targets"][0]["grant_rev"], g1);
    assert_eq!(r.body["targets"][0]["token"], t1);
    let first = r.body["id"].as_str().unwrap().to_owned();
    let other_rev = g1.as_u64().unwrap() + 1000;
    let r = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        req(json!({ "grant_rev": other_rev })),
    )
    .await;
    assert_problem(&r, 409, "not-held");
    let r = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        json!({ "namespace": "ns", "class": "c", "key": "free", "reason": "stuck" }),
    )
    .await;
    assert_problem(&r, 409, "not-held");
    assert!(
        r.body["detail"].as_str().unwrap().contains("ns/c/free"),
        "{:?}",
        r.body
    );
    // A class that does not exist cannot have a holder: 404, not 409.
    let r = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        json!({ "namespace": "ns", "class": "nope", "key": "k", "reason": "stuck" }),
    )
    .await;
    assert_problem(&r, 404, "not-found");
    let r = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        req(json!({ "token": t1 })),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);

    // The holder releases and acquires again before anyone approves.
    let r = call(
        addr,
        "POST",
        "/v1/locks/release",
        OWNER,
        release_body(&s, "k", &g1),
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let (t2, g2) = (r.body["token"].clone(), r.body["grant_rev"].clone());

    // Approving the request made for t1 releases nothing: t2 stays held.
    let approve = |id: &str| format!("/v1/force-releases/{id}/approve");
    let r = call(addr, "POST", &approve(&first), ADMIN2, Value::Null).await;
    assert_problem(&r, 409, "force-target-gone");
    let st = call(addr, "GET", STATUS, ADMIN, Value::Null).await;
    assert_eq!(st.body["holders"][0]["grant_rev"], g2, "{:?}", st.body);
    assert!(recorded.0.lock().unwrap().is_empty());
    let r = call(addr, "POST", &approve(&first), ADMIN2, Value::Null).await;
    assert_problem(&r, 409, "already-approved");

    // A request for t2, approved: exactly t2 is released, and the record names it.
    let r = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        req(json!({ "grant_rev": g2 })),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let second = r.body["id"].as_str().unwrap().to_owned();
    let r = call(addr, "POST", &approve(&second), ADMIN2, Value::Null).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["released"][0]["grant_rev"], g2);
    assert_eq!(r.body["released"][0]["token"], t2);
    {
        let recs = recorded.0.lock().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].request_id, second);
        assert_eq!(Some(recs[0].grant_rev.get()), g2.as_u64());
        assert_eq!(recs[0].token.to_string(), t2.as_str().unwrap());
    }
    // The forced holder's session lives; its keepalive and its release say it was forced.
    let r = call(
        addr,
        "POST",
        &format!("/v1/sessions/{s}/keepalive"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.body["forced"],
        json!([{ "namespace": "ns", "class": "c", "key": "k", "mode": "exclusive",
                 "grant_rev": g2, "request_id": second }])
    );
    let r = call(
        addr,
        "POST",
        "/v1/locks/release",
        OWNER,
        release_body(&s, "k", &g2),
    )
    .await;
    assert_problem(&r, 409, "hold-forced");
    // The forced hold's quota slot went with it.
    assert_eq!(slots(&f).await, 0);
}

#[tokio::test]
async fn etcd_a_forced_remote_hold_fires_lost_while_its_session_lives() {
    let f = fixture(0).await;
    let db = TestDb::create().await;
    let force = ForceReleases::new(pool_of(&db), Arc::new(Recorded::default()));
    force.migrate().await.unwrap();
    let addr = start_replica(f.connect().await.unwrap(), force_options(force))
        .await
        .addr;
    let client = Client::new(format!("http://{addr}"))
        .unwrap()
        .with_dev_identity(OWNER);
    // Keepalive every TTL/3 = 1 s.
    let session = client.open_session(Duration::from_secs(3)).await.unwrap();
    let hold = session
        .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(hold.loss(), None);
    let req = json!({ "namespace": "ns", "class": "c", "key": "k", "reason": "stuck" });
    let r = call(addr, "POST", "/v1/force-releases", ADMIN, req).await;
    let id = r.body["id"].as_str().unwrap().to_owned();
    let r = call(
        addr,
        "POST",
        &format!("/v1/force-releases/{id}/approve"),
        ADMIN2,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    tokio::time::timeout(Duration::from_secs(10), hold.lost())
        .await
        .expect("lost() fires once a keepalive reports the hold forced");
    assert_eq!(hold.loss(), Some(HoldLoss::Forced { request_id: id }));
    assert!(!session.is_lost(), "the session itself lives on");
    let e = hold.release().await.unwrap_err();
    assert!(e.is_hold_forced(), "{e:?}");
}

#[tokio::test]
async fn etcd_try_acquire_with_wait_0_is_granted_on_a_free_lock_every_time() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let s = open(addr, OWNER, 30_000).await;
    let mut refused = Vec::new();
    // wait_ms 0 (try once) and 1: the wait bounds only the waiting, never the
    // service's own etcd calls, so a free lock is granted every time.
    for i in 0..300u64 {
        let r = call(
            addr,
            "POST",
            "/v1/locks/acquire",
            OWNER,
            acquire_body(&s, "k", i % 2),
        )
        .await;
        if r.status != 200 {
            refused.push(r.body);
            continue;
        }
        let r = call(
            addr,
            "POST",
            "/v1/locks/release",
            OWNER,
            release_body(&s, "k", &r.body["grant_rev"]),
        )
        .await;
        assert_eq!(r.status, 204, "{:?}", r.body);
    }
    assert!(
        refused.is_empty(),
        "{} of 300 refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );

    // A held lock: try-acquire fails at once with deadline-exceeded and leaves no waiter.
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let other = open(addr, OTHER, 30_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&other, "k", 0),
    )
    .await;
    assert_problem(&r, 409, "deadline-exceeded");
    let waiters: Vec<String> = keys(&f)
        .await
        .into_iter()
        .filter(|k| k.contains("/q/"))
        .collect();
    assert!(waiters.is_empty(), "{waiters:?}");
    assert_eq!(slots(&f).await, 1, "only the holder's slot");
}

#[tokio::test]
async fn etcd_a_release_that_finds_no_such_hold_frees_no_quota_slot() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let r = call(
        addr,
        "PUT",
        "/v1/namespaces/ns",
        ADMIN,
        json!({ "tenant_id": "tenant", "held_lease_quota": 3 }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let s = open(addr, OWNER, 30_000).await;
    let mut held = 0;
    for key in ["k1", "k2", "k3", "k4", "k5", "k6"] {
        let r = call(
            addr,
            "POST",
            "/v1/locks/acquire",
            OWNER,
            acquire_body(&s, key, 0),
        )
        .await;
        if r.status == 200 {
            held += 1;
            // A release naming another grant of the same lock: 409, and the slot stays.
            let wrong = json!(r.body["grant_rev"].as_u64().unwrap() + 1000);
            let bad = call(
                addr,
                "POST",
                "/v1/locks/release",
                OWNER,
                release_body(&s, key, &wrong),
            )
            .await;
            assert_problem(&bad, 409, "not-held");
        } else {
            assert_problem(&r, 429, "quota-exceeded");
        }
    }
    assert_eq!(
        held, 3,
        "held_lease_quota 3 holds, whatever the releases answered"
    );
    assert_eq!(slots(&f).await, 3);
    // A release of the hold itself frees its slot, in the same Txn.
    let st = call(
        addr,
        "GET",
        "/v1/locks/status?namespace=ns&class=c&key=k1",
        ADMIN,
        Value::Null,
    )
    .await;
    let g = st.body["holders"][0]["grant_rev"].clone();
    let r = call(
        addr,
        "POST",
        "/v1/locks/release",
        OWNER,
        release_body(&s, "k1", &g),
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(slots(&f).await, 2);
}

#[tokio::test]
async fn etcd_sessions_are_limited_per_identity_across_replicas() {
    let f = fixture(0).await;
    let options = || {
        ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(AUTHZ).unwrap()))
            .insecure_dev_identity()
            .with_max_sessions_per_identity(3)
    };
    let a = start_replica(f.connect().await.unwrap(), options())
        .await
        .addr;
    let b = start_replica(f.connect().await.unwrap(), options())
        .await
        .addr;
    // Eight opens at once through two replicas: exactly three succeed.
    let opens: Vec<_> = (0..8)
        .map(|i| {
            let addr = if i % 2 == 0 { a } else { b };
            tokio::spawn(async move {
                call(
                    addr,
                    "POST",
                    "/v1/sessions",
                    OWNER,
                    json!({ "ttl_ms": 30_000 }),
                )
                .await
            })
        })
        .collect();
    let mut opened = Vec::new();
    for o in opens {
        let r = o.await.unwrap();
        if r.status == 201 {
            opened.push(r.body["session"].as_str().unwrap().to_owned());
        } else {
            assert_problem(&r, 429, "quota-exceeded");
            assert!(
                r.body["detail"]
                    .as_str()
                    .unwrap()
                    .contains("3 open sessions"),
                "{:?}",
                r.body
            );
        }
    }
    assert_eq!(opened.len(), 3, "{opened:?}");
    // The refused ones left no lease behind.
    let leases = f.locker.client().clone().leases().await.unwrap();
    assert_eq!(leases.leases().len(), 3);
    // Another identity has its own limit; closing a session frees one.
    assert_eq!(
        call(
            a,
            "POST",
            "/v1/sessions",
            OTHER,
            json!({ "ttl_ms": 30_000 })
        )
        .await
        .status,
        201
    );
    let r = call(
        b,
        "DELETE",
        &format!("/v1/sessions/{}", opened[0]),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(
        call(
            b,
            "POST",
            "/v1/sessions",
            OWNER,
            json!({ "ttl_ms": 30_000 })
        )
        .await
        .status,
        201
    );
}

#[tokio::test]
async fn etcd_the_session_ttl_is_the_ttl_etcd_granted() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let mut short = LockClass::new("tiny", "short", "");
    short.ttl_max = Duration::from_secs(1);
    f.configure(&Namespace::new("tiny", "tenant"), &short)
        .await
        .unwrap();
    let r = call(
        addr,
        "POST",
        "/v1/sessions",
        OWNER,
        json!({ "ttl_ms": 1000 }),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let session = r.body["session"].as_str().unwrap().to_owned();
    let lease = palisade_lock::LeaseId::from_hex(&session).unwrap();
    let granted = f
        .locker
        .client()
        .clone()
        .lease_time_to_live(lease.get(), None)
        .await
        .unwrap()
        .granted_ttl();
    // etcd raises a TTL below its minimum (1.5 election timeouts: 2 s here).
    assert!(granted > 1, "etcd granted {granted} s");
    assert_eq!(r.body["ttl_ms"], json!(granted * 1000));
    let r = call(
        addr,
        "POST",
        &format!("/v1/sessions/{session}/keepalive"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.body["ttl_ms"], json!(granted * 1000));
    // A class whose ttl_max is below what etcd granted refuses the session's acquire.
    let authz = format!(
        "{AUTHZ}\n[[namespace]]\nid = \"tiny\"\n[[namespace.grant]]\nids = [\"{OWNER}\"]\nclasses = [\"short\"]\n"
    );
    let options = ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(&authz).unwrap()))
        .insecure_dev_identity();
    let b = start_replica(f.connect().await.unwrap(), options)
        .await
        .addr;
    let r = call(
        b,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        json!({ "session": session, "namespace": "tiny", "class": "short", "key": "s-1",
                "mode": "exclusive", "wait_ms": 100 }),
    )
    .await;
    assert_problem(&r, 400, "invalid-input");
    assert!(
        r.body["detail"].as_str().unwrap().contains("TTL"),
        "{:?}",
        r.body
    );
}

#[tokio::test]
async fn etcd_a_release_whose_request_or_answer_is_lost_is_sent_again_until_definite() {
    use palisade_testkit::{Loss, LossyProxy};

    let f = fixture(1).await;
    let direct = f.replicas[0].addr;
    let proxy = LossyProxy::start(direct).await;
    let client = Client::new(format!("http://{}", proxy.addr()))
        .unwrap()
        .with_dev_identity(OWNER);
    // A long TTL: no keepalive runs while the proxy loses traffic.
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let holders = |key: &'static str| async move {
        let path = format!("/v1/locks/status?namespace=ns&class=c&key={key}");
        let r = call(direct, "GET", &path, ADMIN, Value::Null).await;
        r.body["holders"].as_array().unwrap().len()
    };
    let acquire = |key: &'static str| {
        session.acquire("ns", "c", key, Mode::Exclusive, Duration::from_secs(1))
    };

    // The answer is lost after the release committed: the retry finds the hold gone,
    // which is the release it asked for.
    let hold = acquire("k1").await.unwrap();
    proxy.set(Loss::NextAnswer);
    hold.release().await.unwrap();
    assert_eq!(proxy.loss(), Loss::None, "the answer was lost once");
    assert_eq!(holders("k1").await, 0);

    // The request is lost before it reached the service: the retry releases.
    let hold = acquire("k2").await.unwrap();
    proxy.set(Loss::NextRequest);
    hold.release().await.unwrap();
    assert_eq!(proxy.loss(), Loss::None, "the request was lost once");
    assert_eq!(holders("k2").await, 0);

    // Nothing gets through for longer than the budget: a typed "outcome unknown", and
    // the release goes on in the background until the service answers.
    let hold = acquire("k3").await.unwrap();
    proxy.set(Loss::Everything);
    let e = hold
        .release_within(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(e.is_outcome_unknown(), "{e:?}");
    assert_eq!(
        holders("k3").await,
        1,
        "still held while nothing gets through"
    );
    proxy.set(Loss::None);
    let released_by = tokio::time::Instant::now() + Duration::from_secs(15);
    while holders("k3").await != 0 {
        assert!(
            tokio::time::Instant::now() < released_by,
            "the background release never got through"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A hold dropped while nothing gets through is released once traffic flows again.
    let hold = acquire("k4").await.unwrap();
    proxy.set(Loss::Everything);
    drop(hold);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(holders("k4").await, 1);
    proxy.set(Loss::None);
    let released_by = tokio::time::Instant::now() + Duration::from_secs(15);
    while holders("k4").await != 0 {
        assert!(
            tokio::time::Instant::now() < released_by,
            "the dropped hold was never released"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
