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

/// `palisade audit tail` keeps its one watch on an idle cluster: its connection's
/// keepalive pings respect etcd's minimum interval (5 s by default). (It pinged every
/// 2 s; etcd closed the connection with `too_many_pings` about every 8 s and the tailer
/// logged a restart each time.)
#[tokio::test]
async fn etcd_audit_tail_keeps_its_watch_through_twenty_idle_seconds() {
    let cluster = EtcdCluster::start(1).await;
    let db = TestDb::create().await;
    let tail = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["audit", "tail", "--etcd", &cluster.endpoints().join(",")])
        .args(["--database", &db.connection_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(tail.id().unwrap() as i32);
    tokio::time::sleep(Duration::from_secs(20)).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), tail.wait_with_output())
        .await
        .expect("audit tail stops on SIGTERM")
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stdout.contains("palisade audit tailer on"),
        "the tailer never started:\n{stdout}\n{stderr}"
    );
    assert!(
        !stderr.contains("starting again"),
        "the tailer restarted on an idle cluster:\n{stderr}"
    );
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

/// `palisade serve ARGS` run to its end (it fails to start); exit code and stderr.
async fn serve_fails(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

#[tokio::test]
async fn serve_startup_errors_name_the_config_or_endpoint_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("authz.toml");
    std::fs::write(
        &bad,
        "admins = [\"spiffe://acme/ops/\"]\n[[namespace]]\nid = \"orders\"\nadmin = []\n",
    )
    .unwrap();
    let epoch = dir.path().join("epoch.json");
    let common = |config: &std::path::Path| {
        vec![
            os("--etcd"),
            os("http://127.0.0.1:2379"),
            os("--insecure-dev-identity"),
            os("--epoch-file"),
            epoch.as_os_str().to_owned().leak(),
            os("--config"),
            config.as_os_str().to_owned().leak(),
        ]
    };
    let (code, err) = serve_fails(&common(&bad)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "malformed authorization config {}, line 4, column 1: unknown field `admin`",
            bad.display()
        )),
        "{err}"
    );
    let missing = dir.path().join("nowhere.toml");
    let (code, err) = serve_fails(&common(&missing)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot read authorization config {}: No such file or directory",
            missing.display()
        )),
        "{err}"
    );
    let mut args = common(&bad);
    args[1] = os("http//127.0.0.1:2379");
    let (code, err) = serve_fails(&args).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--etcd \"http//127.0.0.1:2379\" is not an etcd endpoint"),
        "{err}"
    );
}

#[tokio::test]
async fn etcd_serve_names_a_bad_epoch_file_and_an_unreachable_etcd() {
    let cluster = EtcdCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("authz.toml");
    std::fs::write(&config, format!("admins = [\"{ADMIN}\"]\n")).unwrap();
    let endpoints = cluster.endpoints().join(",");
    // A directory where the file should be: readable by no one, so the start fails on it
    // (a missing directory is refused earlier, as bad input: see tests/cli.rs).
    let epoch = dir.path().join("epoch-is-a-dir");
    std::fs::create_dir(&epoch).unwrap();
    let args = |etcd: &str, epoch: &std::path::Path| {
        vec![
            os("--etcd"),
            std::ffi::OsString::from(etcd).leak() as &std::ffi::OsStr,
            os("--insecure-dev-identity"),
            os("--listen"),
            os("127.0.0.1:0"),
            os("--epoch-file"),
            epoch.as_os_str().to_owned().leak(),
            os("--config"),
            config.as_os_str().to_owned().leak(),
        ]
    };
    let (code, err) = serve_fails(&args(&endpoints, &epoch)).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot use the epoch file {}", epoch.display()))
            && err.contains("Is a directory"),
        "{err}"
    );
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let (code, err) = serve_fails(&args(&closed, &dir.path().join("epoch.json"))).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot start on etcd {closed}"))
            && err.contains("Connection refused"),
        "{err}"
    );
}

/// A `palisade serve` process in dev mode with `extra` flags, and its address once it
/// printed `listening on`; its stderr is collected line by line into the returned vector.
async fn spawn_serve(
    etcd: &str,
    config: &std::path::Path,
    epoch: &std::path::Path,
    extra: &[&str],
) -> (
    tokio::process::Child,
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--etcd", etcd, "--listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(config)
        .arg("--epoch-file")
        .arg(epoch)
        .arg("--insecure-dev-identity")
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (sink, stderr) = (lines.clone(), child.stderr.take().unwrap());
    tokio::spawn(async move {
        let mut r = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = r.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("palisade serve announced nothing")
        .unwrap()
        .unwrap_or_default();
    let addr = first
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("not a listening line: {first:?}"))
        .parse()
        .unwrap();
    (child, addr, lines)
}

/// `GET path`: the status and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the service");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

#[tokio::test]
async fn etcd_serve_without_its_epoch_record_starts_not_ready_and_says_so() {
    let cluster = EtcdCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("authz.toml");
    std::fs::write(&config, format!("admins = [\"{ADMIN}\"]\n")).unwrap();
    let etcd = cluster.endpoints().join(",");
    // A first start records epoch 0 in etcd and in its epoch file.
    let (first, addr, _) = spawn_serve(&etcd, &config, &dir.path().join("a.json"), &[]).await;
    assert_eq!(get(addr, "/readyz"), (200, "ready\n".to_owned()));
    drop(first);
    // Another start whose epoch file is missing: etcd has an epoch, the file none.
    let missing = dir.path().join("b.json");
    let (_second, addr, stderr) = spawn_serve(&etcd, &config, &missing, &[]).await;
    assert_eq!(get(addr, "/livez"), (200, "ok\n".to_owned()));
    let (status, why) = get(addr, "/readyz");
    assert_eq!(status, 503, "{why}");
    assert!(
        why.contains("grants are refused until the epoch is advanced"),
        "{why}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = stderr.lock().unwrap().join("\n");
        if log.contains("NOT READY") || tokio::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        log.contains("NOT READY") && log.contains(&missing.display().to_string()),
        "{log}"
    );
    // stderr is a pipe, not a terminal: no colour codes.
    assert!(!log.contains('\u{1b}'), "{log}");
}

/// JSON logs; SIGHUP with a broken config keeps the old one; SIGTERM answers a waiting
/// acquire 503 `shutting-down` at once and withdraws its waiter key. (The wait used to
/// run on until the grace period ended and the connection closed unanswered.)
#[tokio::test]
async fn etcd_serve_logs_json_reloads_and_answers_a_waiting_acquire_on_sigterm() {
    use nix::sys::signal::{kill, Signal};
    let cluster = EtcdCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let epoch = dir.path().join("epoch.json");
    let locker = Locker::connect(
        LockerOptions::new(cluster.endpoints()),
        FileEpochStore::new(&epoch),
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
    let good = format!("admins = [\"{ADMIN}\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"{JOB}\"]\nclasses = [\"c\"]\n");
    std::fs::write(&config, &good).unwrap();
    let etcd = cluster.endpoints().join(",");
    let (mut server, addr, stderr) =
        spawn_serve(&etcd, &config, &epoch, &["--log-format", "json"]).await;
    assert_eq!(get(addr, "/readyz"), (200, "ready\n".to_owned()));

    // A malformed config on SIGHUP: the old one stays, and the log says where and what.
    std::fs::write(&config, format!("{good}bogus = 1\n")).unwrap();
    let pid = nix::unistd::Pid::from_raw(server.id().unwrap() as i32);
    kill(pid, Signal::SIGHUP).unwrap();
    let wanted = format!(
        "{}, line 7, column 1: unknown field `bogus`",
        config.display()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !stderr.lock().unwrap().iter().any(|l| l.contains(&wanted)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            stderr.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // One hold, and a second acquire waiting for it (a long poll in flight).
    let (status, s1) = call(
        addr,
        "POST",
        "/v1/sessions",
        JOB,
        &json!({ "ttl_ms": 30_000 }),
    );
    assert_eq!(status, 201, "{s1:?}");
    let (status, s2) = call(
        addr,
        "POST",
        "/v1/sessions",
        JOB,
        &json!({ "ttl_ms": 30_000 }),
    );
    assert_eq!(status, 201, "{s2:?}");
    let acquire = |s: &Value, wait_ms: u64| {
        json!({ "session": s["session"], "namespace": "ns", "class": "c", "key": "k",
                "mode": "exclusive", "wait_ms": wait_ms })
    };
    let (status, _) = call(addr, "POST", "/v1/locks/acquire", JOB, &acquire(&s1, 1000));
    assert_eq!(status, 200);
    let body = acquire(&s2, 30_000);
    let in_flight = std::thread::spawn(move || call(addr, "POST", "/v1/locks/acquire", JOB, &body));
    // And the CLI waiting too: it retries the 503 and then finds the replica gone.
    let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["lock", "acquire", "ns/c/k", "--wait-ms", "30000"])
        .args([
            "--service",
            &format!("http://{addr}"),
            "--dev-identity",
            JOB,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let name = palisade_lock::LockName::new("ns", "c", "k");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while locker.lock_state(&name).await.unwrap().waiters.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second acquire never queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let signalled = std::time::Instant::now();
    kill(pid, Signal::SIGTERM).unwrap();
    // The waiting request is answered at once, 503 shutting-down (not a reset connection,
    // nor a wait for its 30 s), its waiter key withdrawn; then the process exits 0.
    let (status, problem) = tokio::task::spawn_blocking(move || in_flight.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        (status, problem["type"].as_str()),
        (503, Some("urn:palisade:problem:shutting-down")),
        "{problem:?}"
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        signalled.elapsed()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let state = locker.lock_state(&name).await.unwrap();
        if state.waiters.is_empty() {
            assert_eq!(state.holders.len(), 1, "the first hold stays: {state:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter key stayed: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exit = tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("palisade serve did not stop on SIGTERM")
        .unwrap();
    // The CLI says why it got no hold: the replica was shutting down (exit 1, unavailable),
    // not only that a connection was refused.
    let out = tokio::time::timeout(Duration::from_secs(20), cli.wait_with_output())
        .await
        .expect("the waiting CLI acquire did not end")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("503 shutting-down"), "{err}");
    assert_eq!(exit.code(), Some(0));
    assert!(std::net::TcpStream::connect(addr).is_err());
    // Every log line is one JSON object with a level; the one error is the failed
    // reload: the 503s the replica chose to answer while stopping are WARN at most.
    let lines = stderr.lock().unwrap().clone();
    assert!(lines.iter().any(|l| l.contains("SIGTERM")), "{lines:?}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string(), "{line}");
        if v["level"] == "ERROR" {
            assert!(line.contains("not reloaded"), "{line}");
        }
    }
}

/// `--tier` names are checked before anything connects: a tier named as the home tier,
/// or a name given twice, is refused naming the flag and the tier (etcd is not even
/// reachable here).
#[tokio::test]
async fn serve_refuses_a_tier_named_as_the_home_tier_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("authz.toml");
    std::fs::write(&config, "admins = [\"spiffe://acme/ops/\"]\n").unwrap();
    let epoch = dir.path().join("epoch.json");
    let with = |tiers: &[&'static str]| {
        let mut args = vec![
            os("--etcd"),
            os("http://127.0.0.1:1"),
            os("--insecure-dev-identity"),
            os("--epoch-file"),
            epoch.as_os_str().to_owned().leak(),
            os("--config"),
            config.as_os_str().to_owned().leak(),
            os("--home-tier"),
            os("main"),
        ];
        for t in tiers {
            args.extend([os("--tier"), os(t)]);
        }
        args
    };
    let (code, err) = serve_fails(&with(&["main=http://127.0.0.1:2"])).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--tier main=...: main is the home tier's name (--home-tier main"),
        "{err}"
    );
    let (code, err) = serve_fails(&with(&[
        "east=http://127.0.0.1:2",
        "east=http://127.0.0.1:3",
    ]))
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--tier east=... is given twice"), "{err}");
}

/// The listening mode is checked before anything connects (etcd is not even reachable
/// here): certificate files that cannot be used, and dev mode on an address that is not
/// loopback, are bad input (exit 2) naming the flag and the file or address.
#[tokio::test]
async fn serve_refuses_unusable_tls_files_and_dev_mode_off_loopback_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("authz.toml");
    std::fs::write(&config, "admins = [\"spiffe://acme/ops/\"]\n").unwrap();
    let epoch = dir.path().join("epoch.json");
    let not_pem = dir.path().join("notpem.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let base = |extra: Vec<&'static std::ffi::OsStr>| {
        let mut args = vec![
            os("--etcd"),
            os("http://127.0.0.1:1"),
            os("--epoch-file"),
            epoch.as_os_str().to_owned().leak(),
            os("--config"),
            config.as_os_str().to_owned().leak(),
        ];
        args.extend(extra);
        args
    };
    let path =
        |p: &std::path::Path| -> &'static std::ffi::OsStr { p.as_os_str().to_owned().leak() };

    for listen in ["0.0.0.0:18081", "[::]:18081"] {
        let (code, err) = serve_fails(&base(vec![
            os("--insecure-dev-identity"),
            os("--listen"),
            os(listen),
        ]))
        .await;
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!(
                "--listen {listen}: dev mode (--insecure-dev-identity) binds to loopback only"
            )),
            "{err}"
        );
        assert!(!err.contains("etcd"), "refused before connecting: {err}");
    }
    assert!(!epoch.exists(), "no epoch file was written");

    let tls = |cert: &std::path::Path, key: &std::path::Path| {
        base(vec![
            os("--tls-cert"),
            path(cert),
            os("--tls-key"),
            path(key),
            os("--client-ca"),
            path(cert),
        ])
    };
    let (code, err) = serve_fails(&tls(&missing, &not_pem)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot read the --tls-cert {}: ",
            missing.display()
        )),
        "{err}"
    );
    let (code, err) = serve_fails(&tls(&not_pem, &not_pem)).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot read the --tls-cert {}: it holds no PEM certificate",
            not_pem.display()
        )),
        "{err}"
    );
    assert!(!epoch.exists(), "no epoch file was written");
}
