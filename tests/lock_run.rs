//! `palisade lock run` against a lock service on loopback and real etcd members started
//! by the test harness (every test here starts etcd: `etcd` in each name).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use palisade_lock::{LeaseId, LockClass, LockName, Namespace};
use palisade_server::testing::{serve_dev_on_loopback, ServiceFixture};
use palisade_server::{Authz, AuthzConfig, ServiceOptions};

const ME: &str = "spiffe://test/job";

/// etcd, namespace `ns` with class `c`, and the service in dev mode.
async fn setup() -> (ServiceFixture, SocketAddr) {
    let f = ServiceFixture::start(1, Duration::from_secs(1))
        .await
        .unwrap();
    f.configure(&Namespace::new("ns", "t"), &LockClass::new("ns", "c", ""))
        .await
        .unwrap();
    let authz = AuthzConfig::from_toml(
        "admins = [\"spiffe://test/admin\"]\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"spiffe://test/job\"]\nclasses = [\"c\"]\n",
    )
    .unwrap();
    let options = ServiceOptions::new(Authz::fixed(authz)).insecure_dev_identity();
    let served = serve_dev_on_loopback(f.locker.clone(), options)
        .await
        .unwrap();
    (f, served.addr)
}

fn lock_run(addr: SocketAddr, ttl: &str, script: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    cmd.args([
        "lock",
        "run",
        "ns/c/jobs/nightly",
        "--service",
        &format!("http://{addr}"),
        "--dev-identity",
        ME,
        "--ttl",
        ttl,
        "--holder-meta",
        r#"{"job":"nightly"}"#,
        "--",
        "sh",
        "-c",
        script,
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn etcd_lock_run_passes_the_token_and_releases() {
    let (f, addr) = setup().await;
    let (locker, out_file) = (&f.locker, f.dir().join("token"));
    let script = format!("echo $FENCING_TOKEN > {}; exit 7", out_file.display());
    let out = lock_run(addr, "5", &script).output().await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token: u64 = std::fs::read_to_string(&out_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token > 0);
    // Released on exit: nobody holds the lock, and the next run gets a higher token.
    let state = locker
        .lock_state(&LockName::new("ns", "c", "jobs/nightly"))
        .await
        .unwrap();
    assert!(state.holders.is_empty(), "{state:?}");
    let out = lock_run(
        addr,
        "5",
        &format!("echo $FENCING_TOKEN > {}", out_file.display()),
    )
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let next: u64 = std::fs::read_to_string(&out_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(next > token, "{next} <= {token}");
}

#[tokio::test]
async fn etcd_lock_run_kills_the_command_when_the_hold_is_lost() {
    let (f, addr) = setup().await;
    let (locker, pid_file) = (&f.locker, f.dir().join("pid"));
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut run = lock_run(addr, "3", &script).spawn().unwrap();
    let name = LockName::new("ns", "c", "jobs/nightly");
    let mut holder = None;
    for _ in 0..100 {
        let state = locker.lock_state(&name).await.unwrap();
        if let (Some(h), true) = (state.holders.first(), pid_file.exists()) {
            // The runner's --holder-meta is stored with the hold.
            assert_eq!(
                serde_json::Value::from(h.holder_meta.clone().unwrap()),
                serde_json::json!({"job": "nightly"})
            );
            holder = Some(h.lease);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lease: LeaseId = holder.expect("lock run never held the lock");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    // The session ends behind the runner's back: it must notice and kill the command.
    locker.revoke_session(lease).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), run.wait())
        .await
        .expect("lock run did not stop after its hold was lost")
        .unwrap();
    assert_eq!(status.code(), Some(76));
    // The child is gone (killed and reaped), not left running.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "child still running: {stat}"
    );
}

#[tokio::test]
async fn etcd_lock_status_prints_the_service_answer() {
    let (_f, addr) = setup().await;
    let url = format!("http://{addr}");
    let as_id = |id: &str, args: Vec<&str>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
        cmd.args(args)
            .args(["--service", &url, "--dev-identity", id]);
        cmd.output()
    };
    let out = as_id(ME, vec!["lock", "status", "ns/c/jobs/a b"])
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["holders"], serde_json::json!([]));
    assert_eq!(v["class"]["id"], "c");
    // Not allowed to see the class: the service's 403 becomes exit 7 with the problem.
    let out = as_id(
        "spiffe://test/else",
        vec!["lock", "status", "ns/c/jobs/a b"],
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("403 forbidden"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn etcd_lock_run_kills_the_command_when_the_hold_is_force_released() {
    let (f, addr) = setup().await;
    let (locker, pid_file) = (&f.locker, f.dir().join("pid"));
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut run = lock_run(addr, "3", &script).spawn().unwrap();
    let name = LockName::new("ns", "c", "jobs/nightly");
    let mut holder = None;
    for _ in 0..100 {
        let state = locker.lock_state(&name).await.unwrap();
        if let (Some(h), true) = (state.holders.first(), pid_file.exists()) {
            holder = Some((h.lease, h.mode));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (lease, mode) = holder.expect("lock run never held the lock");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Forced while its session lives: the runner learns it from its next keepalive.
    let marker = palisade_api::keys::ForceMarker {
        request_id: "r-1".into(),
        requester: "spiffe://test/admin".into(),
        reason: "stuck".into(),
    };
    locker
        .force_release(&name, lease, mode, &marker)
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), run.wait())
        .await
        .expect("lock run did not stop after its hold was forced")
        .unwrap();
    assert_eq!(status.code(), Some(76));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "child still running: {stat}"
    );
}
