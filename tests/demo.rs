//! The demo's scenario, headless: `examples/demo/` on its own three-member etcd and a
//! fresh database on the local PostgreSQL, with its outcome checked, and the examples it
//! runs (the tests that start etcd have `etcd` in their names).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The demo's path. `cargo test` (and nextest) build the examples next to the binaries;
/// they are built here only if missing.
fn demo_binary() -> PathBuf {
    let palisade = PathBuf::from(env!("CARGO_BIN_EXE_palisade"));
    let profile_dir = palisade.parent().expect("bin dir").to_owned();
    let examples = profile_dir.join("examples");
    if ["demo", "worker", "protected_service"]
        .iter()
        .all(|e| examples.join(e).is_file())
    {
        return examples.join("demo");
    }
    let target_dir = profile_dir.parent().expect("target dir").to_owned();
    let mut build = Command::new(env!("CARGO"));
    build
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "palisade",
            "--bins",
            "--examples",
        ])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("cargo build");
    assert!(status.success(), "building the examples failed");
    profile_dir.join("examples").join("demo")
}

fn alive(pid: u64) -> bool {
    // A zombie (exited, not yet reaped by anyone) is not running.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

#[test]
fn etcd_demo_stops_the_stale_writer_and_audits_the_unprotected_write() {
    let demo = demo_binary();
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.json");
    let out = Command::new(&demo)
        .arg("--summary")
        .arg(&summary)
        .env("PALISADE_DEMO_SHOW_LOGS", "1")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();

    // Tokens strictly increase: A, then B after A's lease expired, then A again.
    let tokens: Vec<u64> = s["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(tokens.len(), 3, "{s}");
    assert!(tokens[0] < tokens[1] && tokens[1] < tokens[2], "{tokens:?}");

    // A's stale write: refused by the layer (409, nothing reached the handler) and by the
    // database (the fenced transaction saw B's higher mark).
    let stale = s["stale"].as_array().unwrap();
    let http = stale
        .iter()
        .find(|a| a["via"] == "http")
        .expect("http answer");
    assert_eq!(http["status"], 409, "{http}");
    assert_eq!(http["token"], tokens[0]);
    let problem: Value = serde_json::from_str(http["body"].as_str().unwrap()).unwrap();
    assert_eq!(problem["highest"], tokens[1].to_string(), "{problem}");
    let db = stale
        .iter()
        .find(|a| a["via"] == "postgres")
        .expect("postgres answer");
    assert_eq!(db["committed"], false, "{db}");
    assert_eq!(db["stale"], true, "{db}");
    assert_eq!(db["highest"], tokens[1], "{db}");

    // The legacy job's write: admitted and recorded as unprotected, with who, what, where.
    let u = &s["unprotected"];
    assert_eq!(u["count"], 1, "{u}");
    assert_eq!(u["service"], "reports-legacy");
    assert_eq!(u["outcome"], "unprotected");
    assert_eq!(u["resource"], "/legacy/report-7");
    assert_eq!(u["method"], "PUT");
    assert_eq!(u["finding"], "missing_token");
    assert_eq!(u["enforcement"], "advisory");
    assert_eq!(u["caller"], "spiffe://acme/legacy-export");
    assert_eq!(u["namespace"], "legacy");
    assert_eq!(u["class"], "reports");
    assert!(u["token"].is_null(), "{u}");

    // Two refusals (layer and database), everything else admitted.
    assert_eq!(s["rejected"], 2, "{s}");
    assert_eq!(s["admitted"], 8, "{s}");

    // Nothing the demo started is left running.
    let pids: Vec<u64> = s["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(
        pids.len(),
        10,
        "three etcd members, lock service, tailer, dashboard, two services, two workers"
    );
    let left: Vec<u64> = pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "still running: {left:?}");
}

#[tokio::test]
async fn etcd_worker_reports_no_loss_after_a_release_or_quit() {
    use palisade_lock::{LockClass, Namespace};
    use palisade_server::testing::{serve_dev_on_loopback, ServiceFixture};
    use palisade_server::{Authz, AuthzConfig, ServiceOptions};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    let worker = demo_binary().with_file_name("worker");
    let f = ServiceFixture::start(1, std::time::Duration::from_secs(1))
        .await
        .unwrap();
    f.configure(
        &Namespace::new("orders", "t"),
        &LockClass::new("orders", "invoices", ""),
    )
    .await
    .unwrap();
    let authz = AuthzConfig::from_toml(
        "[[namespace]]\nid = \"orders\"\n[[namespace.grant]]\nids = [\"spiffe://test/w\"]\nclasses = [\"invoices\"]\n",
    )
    .unwrap();
    let options = ServiceOptions::new(Authz::fixed(authz)).insecure_dev_identity();
    let served = serve_dev_on_loopback(f.locker.clone(), options)
        .await
        .unwrap();
    let mut child = tokio::process::Command::new(worker)
        .args(["--service", &served.url(), "--identity", "spiffe://test/w"])
        .args([
            "--lock",
            "orders/invoices/k",
            "--target",
            "http://127.0.0.1:9/x",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut events = Vec::new();
    for cmd in ["acquire", "release"] {
        stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .unwrap();
        let line = lines.next_line().await.unwrap().expect("an answer");
        events.push(serde_json::from_str::<Value>(&line).unwrap()["event"].clone());
    }
    stdin.write_all(b"quit\n").await.unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        events.push(serde_json::from_str::<Value>(&line).unwrap()["event"].clone());
    }
    assert!(child.wait().await.unwrap().success());
    // Released and closed on purpose: nothing was lost.
    assert_eq!(events, vec!["acquired", "released"], "{events:?}");
}

/// An etcd member that cannot start ends the demo at once with an error naming it, the
/// database it made dropped. (A cluster started without it lost quorum when the demo
/// killed the leader, and the demo waited for a leader that could not be elected.)
#[tokio::test]
async fn etcd_demo_whose_etcd_member_cannot_start_fails_naming_it_and_drops_its_database() {
    use std::os::unix::fs::PermissionsExt;

    let demo = demo_binary();
    let dir = tempfile::tempdir().unwrap();
    let real = palisade_testkit::EtcdBinaries::get().etcd().to_owned();
    let wrapper = dir.path().join("etcd");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --name=m2 \"*) \
             echo 'simulated start failure of member m2' >&2; exit 1;; esac\n\
             exec '{}' \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

    let started = std::time::Instant::now();
    let child = Command::new(&demo)
        .env(palisade_testkit::ETCD_VARIABLE, &wrapper)
        .env("PALISADE_DEMO_SHOW_LOGS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the demo");
    let dbname = format!("palisade_demo_{}", child.id());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains("starting etcd") && stderr.contains("simulated start failure of member m2"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("[1]"), "no step ran:\n{stdout}");

    assert_no_database(&dbname).await;
}

/// A demo drops the databases that killed demos left (their processes gone), keeps the
/// one of a demo still running, and names the etcd it cannot run with how it was chosen.
#[tokio::test]
async fn demo_sweeps_killed_demos_databases_and_names_the_etcd_it_cannot_run() {
    use std::os::unix::fs::PermissionsExt;

    let demo = demo_binary();
    let dead = {
        let mut gone = Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        pid
    };
    let left = format!("palisade_demo_{dead}");
    let running = format!("palisade_demo_{}", std::process::id());
    let admin = admin_client().await;
    for name in [&left, &running] {
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let etcd = dir.path().join("etcd");
    std::fs::write(&etcd, "#!/bin/sh\necho 'no etcd here' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&demo)
        .env(palisade_testkit::ETCD_VARIABLE, &etcd)
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "dropped database {left}, left by a demo that is no longer running"
        )),
        "{stdout}"
    );
    assert!(
        stderr.contains("(the etcd PALISADE_ETCD names) failed (exit status: 3): no etcd here"),
        "{stderr}"
    );
    assert_no_database(&left).await;
    let kept = admin
        .query("SELECT 1 FROM pg_database WHERE datname = $1", &[&running])
        .await
        .unwrap();
    admin
        .batch_execute(&format!("DROP DATABASE {running}"))
        .await
        .unwrap();
    assert_eq!(kept.len(), 1, "the running demo's database was dropped");
}

/// A demo whose terminal closes (SIGHUP) mid-scenario stops everything it started and
/// drops its database, as on SIGTERM or Ctrl-C, and exits 129 (128 + SIGHUP).
#[tokio::test]
async fn etcd_demo_hung_up_mid_scenario_stops_everything_and_drops_its_database() {
    use std::io::BufRead;

    let demo = demo_binary();
    let mut child = Command::new(&demo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the demo");
    let dbname = format!("palisade_demo_{}", child.id());
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while stdout.read_line(&mut line).unwrap() > 0 {
        seen.push_str(&line);
        if line.starts_with("[1]") {
            break;
        }
        line.clear();
    }
    assert!(
        seen.contains("[1]"),
        "the demo never reached step 1:\n{seen}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Asked to stop, not failed: 128 + SIGHUP's number, and no logs kept.
    assert_eq!(out.status.code(), Some(129), "{seen}{rest}\n{stderr}");
    assert!(stderr.contains("demo stopped by SIGHUP"), "{stderr}");
    assert!(!stderr.contains("logs are in"), "{stderr}");
    let stopped: usize = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("stopping ")?
                .strip_suffix(" processes")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no stopping line:\n{rest}"));
    assert_eq!(stopped, 10, "{rest}");

    assert_no_database(&dbname).await;
}

/// A connection to the local PostgreSQL as its administrator.
async fn admin_client() -> tokio_postgres::Client {
    let admin = std::env::var("PALISADE_PG_ADMIN")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres".into());
    let (pg, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    pg
}

/// Asserts that the local PostgreSQL has no database `dbname` (the demo drops its own).
async fn assert_no_database(dbname: &str) {
    let left = admin_client()
        .await
        .query("SELECT 1 FROM pg_database WHERE datname = $1", &[&dbname])
        .await
        .unwrap();
    assert!(left.is_empty(), "database {dbname} was left behind");
}

/// `examples/protected_service.rs` answers an id Postgres cannot store (a `%00` in the
/// path) with 400 on its fenced and its advisory route, and still writes a good one.
#[tokio::test]
async fn protected_service_refuses_an_id_with_a_nul_as_the_clients_mistake() {
    use std::io::{BufRead, BufReader, Read, Write};
    let service = demo_binary().with_file_name("protected_service");
    let db = palisade_testkit::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(&service)
        .arg("--database")
        .arg(db.connection_string())
        .arg("--spool")
        .arg(dir.path().join("spool.jsonl"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start protected_service");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    let put = |path: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "PUT {path} HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nContent-Length: 1\r\n\
             Connection: close\r\n\r\nx"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    };
    let nul = put("/orders/a%00b");
    let legacy = put("/legacy/a%00b");
    let good = put("/orders/a-b");
    let _ = child.kill();
    let _ = child.wait();
    assert!(nul.starts_with("HTTP/1.1 400"), "{nul}");
    assert!(
        nul.contains(r#"id "a\0b" holds a control character"#),
        "{nul}"
    );
    assert!(legacy.starts_with("HTTP/1.1 400"), "{legacy}");
    assert!(good.starts_with("HTTP/1.1 200"), "{good}");
    let client = db.connect().await;
    let ids: Vec<String> = client
        .query("SELECT id FROM invoice", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec!["a-b".to_owned()]);
}
