//! `palisade serve --database`: two-person force release recorded in the audit trail,
//! against real etcd members and a real PostgreSQL database started or created by the
//! test harness (tests that start etcd have `etcd` in their names).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use palisade_lock::{FileEpochStore, LockClass, Locker, LockerOptions, Namespace};
use palisade_testkit::{EtcdCluster, TestDb};
use serde_json::{json, Value};

const JOB: &str = "spiffe://test/job";
const ADMIN: &str = "spiffe://test/admin";
const ADMIN2: &str = "spiffe://test/admin2";

/// One HTTP/1.0 request with the dev identity header; the status code and the JSON body.
fn call(addr: SocketAddr, method: &str, path: &str, id: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the service");
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nx-palisade-dev-identity: {id}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("a complete response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn etcd_serve_records_an_approved_force_release_in_the_audit_trail() {
    let cluster = EtcdCluster::start(1).await;
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let epoch_file = dir.path().join("epoch.json");
    let locker = Locker::connect(
        LockerOptions::new(cluster.endpoints()),
        FileEpochStore::new(&epoch_file),
    )
    .await
    .unwrap();
    locker
        .config()
        .put_namespace(&Namespace::new("ns", "t"))
        .await
        .unwrap();
    locker
        .config()
        .put_class(&LockClass::new("ns", "c", ""))
        .await
        .unwrap();
    let config = dir.path().join("authz.toml");
    std::fs::write(
        &config,
        format!("admins = [\"{ADMIN}\", \"{ADMIN2}\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"{JOB}\"]\nclasses = [\"c\"]\n"),
    )
    .unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let _server = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "serve",
            "--etcd",
            &cluster.endpoints().join(","),
            "--listen",
            &addr.to_string(),
        ])
        .arg("--config")
        .arg(&config)
        .arg("--epoch-file")
        .arg(&epoch_file)
        .args([
            "--insecure-dev-identity",
            "--database",
            &db.connection_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "palisade serve did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (status, s) = call(
        addr,
        "POST",
        "/v1/sessions",
        JOB,
        &json!({ "ttl_ms": 10_000 }),
    );
    assert_eq!(status, 201, "{s:?}");
    let session = s["session"].as_str().unwrap().to_owned();
    let (status, hold) = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        JOB,
        &json!({ "session": session,
        "namespace": "ns", "class": "c", "key": "jobs/nightly", "mode": "exclusive", "wait_ms": 1000 }),
    );
    assert_eq!(status, 200, "{hold:?}");
    let (status, req) = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        &json!({
        "namespace": "ns", "class": "c", "key": "jobs/nightly", "reason": "wedged" }),
    );
    assert_eq!(status, 201, "{req:?}");
    let approve = format!("/v1/force-releases/{}/approve", req["id"].as_str().unwrap());
    let (status, p) = call(addr, "POST", &approve, ADMIN, &Value::Null);
    assert_eq!(
        (status, p["type"].as_str()),
        (403, Some("urn:palisade:problem:forbidden"))
    );
    let (status, done) = call(addr, "POST", &approve, ADMIN2, &Value::Null);
    assert_eq!(status, 200, "{done:?}");
    assert_eq!(done["released"][0]["token"], hold["token"]);
    let revision = done["released"][0]["revision"].as_i64().unwrap();

    let pg = db.connect().await;
    let rows = pg
        .query(
            "SELECT request_id, cluster_id, revision, lock_key, requester, approver, reason, class_was_fenced \
             FROM force_release",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.get::<_, String>(0), req["id"].as_str().unwrap());
    assert_eq!(r.get::<_, i64>(1), locker.epoch().0.cluster_id as i64);
    assert_eq!(r.get::<_, i64>(2), revision);
    assert_eq!(r.get::<_, String>(3), "jobs/nightly");
    assert_eq!(
        (r.get::<_, String>(4), r.get::<_, String>(5)),
        (ADMIN.to_owned(), ADMIN2.to_owned())
    );
    assert_eq!(r.get::<_, String>(6), "wedged");
    assert!(r.get::<_, bool>(7));
    // The hold is gone.
    assert!(locker
        .lock_state(&palisade_lock::LockName::new("ns", "c", "jobs/nightly"))
        .await
        .unwrap()
        .holders
        .is_empty());
}
