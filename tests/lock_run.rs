//! `palisade lock run` against a lock service on loopback and real etcd members started
//! by the test harness (every test here starts etcd: `etcd` in each name): the token and
//! the hold in the command's environment, signals forwarded the way a supervisor stops a
//! job, and the hold released or lost with the command.

mod common;

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
    lock_run_at(&format!("http://{addr}"), ttl, &[], script)
}

/// `palisade lock run ns/c/jobs/nightly` against the service at `url`, with `extra` flags,
/// running `sh -c script`.
fn lock_run_at(url: &str, ttl: &str, extra: &[&str], script: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    cmd.args(["lock", "run", "ns/c/jobs/nightly"])
        .args(extra)
        .args([
            "--service",
            url,
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
        .env_remove("PALISADE_SERVICE")
        .env_remove("PALISADE_DEV_IDENTITY")
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

/// Waits until `file` holds a pid and the lock has a holder; the pid and the holder.
async fn running(
    locker: &palisade_lock::Locker,
    file: &std::path::Path,
) -> (i32, palisade_lock::Holder) {
    let name = LockName::new("ns", "c", "jobs/nightly");
    for _ in 0..200 {
        let state = locker.lock_state(&name).await.unwrap();
        let pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok());
        if let (Some(h), Some(pid)) = (state.holders.first(), pid) {
            return (pid, h.clone());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("lock run never ran its command under the lock");
}

/// Whether process `pid` has exited (gone, or a zombie), waiting up to 10 s for it.
async fn gone(pid: i32) -> bool {
    for _ in 0..200 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn holders(locker: &palisade_lock::Locker) -> usize {
    locker
        .lock_state(&LockName::new("ns", "c", "jobs/nightly"))
        .await
        .unwrap()
        .holders
        .len()
}

#[tokio::test]
async fn etcd_lock_run_forwards_term_int_and_hup_to_the_command_group_and_releases() {
    use nix::sys::signal::{kill, Signal};
    let (f, addr) = setup().await;
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        let (pid_file, bg_file) = (f.dir().join("pid"), f.dir().join("bg"));
        let _ = std::fs::remove_file(&pid_file);
        // A background job of the command: only a signal to the group reaches it.
        let script = format!(
            "sleep 60 & echo $! > {}; echo $$ > {}; wait",
            bg_file.display(),
            pid_file.display()
        );
        // A TTL far longer than the test: only a release explains a free lock.
        let mut run = lock_run(addr, "30", &script).spawn().unwrap();
        let (pid, _) = running(&f.locker, &pid_file).await;
        let bg: i32 = std::fs::read_to_string(&bg_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        kill(nix::unistd::Pid::from_raw(run.id().unwrap() as i32), sig).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), run.wait())
            .await
            .unwrap_or_else(|_| panic!("lock run did not stop on {sig}"))
            .unwrap();
        // The shell died of the forwarded signal: 128 + its number, as a shell reports.
        assert_eq!(status.code(), Some(128 + sig as i32), "{sig}");
        assert!(gone(pid).await, "the command survived {sig}");
        assert!(
            gone(bg).await,
            "the command's background job survived {sig}"
        );
        assert_eq!(holders(&f.locker).await, 0, "the hold outlived {sig}");
    }
}

#[tokio::test]
async fn etcd_lock_run_kills_a_command_that_ignores_the_signal_after_the_grace() {
    use nix::sys::signal::{kill, Signal};
    let (f, addr) = setup().await;
    let pid_file = f.dir().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 1; done",
        pid_file.display()
    );
    let run = lock_run_at(
        &format!("http://{addr}"),
        "30",
        &["--grace-ms", "300"],
        &script,
    )
    .spawn()
    .unwrap();
    let (pid, _) = running(&f.locker, &pid_file).await;
    kill(
        nix::unistd::Pid::from_raw(run.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), run.wait_with_output())
        .await
        .expect("lock run did not stop after its grace period")
        .unwrap();
    // SIGKILL after the grace: 128 + 9.
    assert_eq!(out.status.code(), Some(137), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("grace period"),
        "{out:?}"
    );
    assert!(gone(pid).await);
    assert_eq!(holders(&f.locker).await, 0);
}

#[tokio::test]
async fn etcd_lock_run_exports_the_lock_session_and_grant_revision() {
    use nix::sys::signal::{kill, Signal};
    let (f, addr) = setup().await;
    let (pid_file, env_file) = (f.dir().join("pid"), f.dir().join("env"));
    let script = format!(
        "echo \"$FENCING_TOKEN $PALISADE_LOCK $PALISADE_SESSION $PALISADE_GRANT_REV\" > {}; \
         echo $$ > {}; exec sleep 60",
        env_file.display(),
        pid_file.display()
    );
    let mut run = lock_run(addr, "30", &script).spawn().unwrap();
    let (_, holder) = running(&f.locker, &pid_file).await;
    let env = std::fs::read_to_string(&env_file).unwrap();
    let fields: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(
        fields,
        vec![
            holder.token.to_string().as_str(),
            "ns/c/jobs/nightly",
            holder.lease.to_string().as_str(),
            holder.grant_rev.get().to_string().as_str(),
        ]
    );
    kill(
        nix::unistd::Pid::from_raw(run.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = run.wait().await.unwrap();
    assert_eq!(status.code(), Some(143));
}

#[tokio::test]
async fn etcd_lock_run_signalled_while_waiting_leaves_no_waiter() {
    use nix::sys::signal::{kill, Signal};
    let (f, addr) = setup().await;
    let pid_file = f.dir().join("pid");
    let first = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut holder = lock_run(addr, "30", &first).spawn().unwrap();
    running(&f.locker, &pid_file).await;
    let never = f.dir().join("never");
    let mut waiter = lock_run_at(
        &format!("http://{addr}"),
        "30",
        &["--wait-ms", "60000"],
        &format!("touch {}", never.display()),
    )
    .spawn()
    .unwrap();
    let name = LockName::new("ns", "c", "jobs/nightly");
    let mut queued = false;
    for _ in 0..200 {
        if !f.locker.lock_state(&name).await.unwrap().waiters.is_empty() {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(queued, "the second lock run never queued");
    kill(
        nix::unistd::Pid::from_raw(waiter.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), waiter.wait())
        .await
        .expect("a waiting lock run did not stop on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(143));
    let mut err = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err)
        .await
        .unwrap();
    assert!(
        err.contains("terminated (SIGTERM) while waiting for the lock; the command did not run"),
        "{err}"
    );
    assert!(!never.exists(), "the command ran without the lock");
    let state = f.locker.lock_state(&name).await.unwrap();
    assert!(state.waiters.is_empty(), "{state:?}");
    assert_eq!(state.holders.len(), 1);
    kill(
        nix::unistd::Pid::from_raw(holder.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    holder.wait().await.unwrap();
}

#[tokio::test]
async fn etcd_lock_run_exits_within_a_ttl_of_a_loss_while_the_service_is_stopped() {
    use nix::sys::signal::{kill, Signal};
    let s = common::service::Service::start(common::service::Mode::Dev, None).await;
    let pid_file = s.dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut run = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    run.args(["lock", "run", "ns/c/jobs/nightly", "--ttl", "2"])
        .args(["--service", &s.url, "--dev-identity", common::service::JOB])
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let run = run.spawn().unwrap();
    let (pid, _) = running(&s.locker, &pid_file).await;
    // The service stops answering (its port still accepts connections).
    let server = nix::unistd::Pid::from_raw(s.server_pid() as i32);
    kill(server, Signal::SIGSTOP).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(15), run.wait_with_output()).await;
    kill(server, Signal::SIGCONT).unwrap();
    let out = out
        .expect("lock run waited for a stopped service after its hold was lost")
        .unwrap();
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the hold was lost"),
        "{out:?}"
    );
    assert!(gone(pid).await, "the command survived the loss");
}

#[tokio::test]
async fn etcd_lock_run_kills_the_command_when_the_hold_is_force_released() {
    let (f, addr) = setup().await;
    let pid_file = f.dir().join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut run = lock_run(addr, "3", &script).spawn().unwrap();
    let (pid, holder) = running(&f.locker, &pid_file).await;
    // Forced while its session lives: the runner learns it from its next keepalive.
    let marker = palisade_api::keys::ForceMarker {
        request_id: "r-1".into(),
        requester: "spiffe://test/admin".into(),
        reason: "stuck".into(),
    };
    let name = LockName::new("ns", "c", "jobs/nightly");
    f.locker
        .force_release(&name, holder.lease, holder.mode, &marker)
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), run.wait())
        .await
        .expect("lock run did not stop after its hold was forced")
        .unwrap();
    assert_eq!(status.code(), Some(76));
    assert!(gone(pid).await, "the command survived the forced release");
}

/// The session of a `lock run` that waits for the lock ends (here revoked in etcd, as a
/// lapsed lease is): `lock run` exits 76, the hold lost, not 3 (`not-found`, which the
/// service answers for a session it no longer knows), and the command never runs.
#[tokio::test]
async fn etcd_lock_run_whose_session_ends_while_it_waits_exits_76() {
    let (f, addr) = setup().await;
    let pid_file = f.dir().join("pid");
    let mut holder = lock_run(
        addr,
        "30",
        &format!("echo $$ > {}; exec sleep 30", pid_file.display()),
    )
    .spawn()
    .unwrap();
    running(&f.locker, &pid_file).await;
    let ran = f.dir().join("ran");
    // A TTL of 6 s: its keepalive (every 2 s) learns of the end soon.
    let waiter = lock_run_at(
        &format!("http://{addr}"),
        "6",
        &["--wait-ms", "60000"],
        &format!("touch {}", ran.display()),
    )
    .spawn()
    .unwrap();
    let name = LockName::new("ns", "c", "jobs/nightly");
    let mut lease = None;
    for _ in 0..200 {
        if let Some(w) = f.locker.lock_state(&name).await.unwrap().waiters.first() {
            lease = Some(w.lease);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lease = lease.expect("lock run never queued");
    f.locker.revoke_session(lease).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), waiter.wait_with_output())
        .await
        .expect("lock run kept waiting after its session ended")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert!(
        stderr.contains("the session ended while waiting for the lock"),
        "{stderr}"
    );
    assert!(!ran.exists(), "the command ran without the lock");
    // The holder was not disturbed.
    assert_eq!(holders(&f.locker).await, 1);
    holder.start_kill().unwrap();
    holder.wait().await.unwrap();
}
