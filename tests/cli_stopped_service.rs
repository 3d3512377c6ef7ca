//! Every `palisade` command that talks to the lock service returns within its deadline,
//! with its documented exit code, while the service does not answer: a real
//! `palisade serve` process stopped with SIGSTOP (its port still accepts connections,
//! nothing answers), resumed with SIGCONT at the end. Every test here starts etcd (`etcd`
//! in each name).

mod common;

use std::time::Duration;

use common::service::{run, Mode, Out, Service, JOB};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_lock::LockName;

/// The service process stopped for as long as this lives; resumed when it drops, even
/// when an assertion failed.
struct Stopped(Pid);

impl Stopped {
    fn new(s: &Service) -> Stopped {
        let pid = Pid::from_raw(i32::try_from(s.server_pid()).unwrap());
        kill(pid, Signal::SIGSTOP).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// `palisade ARGS --service URL --dev-identity JOB`, given at most `bound` to return.
async fn within(s: &Service, bound: Duration, args: &[&str]) -> Out {
    let mut all: Vec<&str> = args.to_vec();
    let at = all.iter().position(|a| *a == "--").unwrap_or(all.len());
    let conn = ["--service", &s.url, "--dev-identity", JOB];
    all.splice(at..at, conn);
    tokio::time::timeout(bound, run(all, &[]))
        .await
        .unwrap_or_else(|_| panic!("palisade {args:?} did not return within {bound:?}"))
}

#[tokio::test]
async fn etcd_cli_commands_return_with_their_codes_while_the_service_is_stopped() {
    let s = Service::start(Mode::Dev, None).await;
    let hold_file = s.dir.path().join("hold.json");
    let held = s
        .dev(JOB, &["lock", "acquire", "ns/c/k", "--ttl", "60"])
        .await
        .ok();
    std::fs::write(&hold_file, &held.stdout).unwrap();
    let session = s
        .dev(JOB, &["session", "open", "--ttl", "60"])
        .await
        .ok()
        .json()["session"]
        .as_str()
        .unwrap()
        .to_owned();
    // A `lock run` waits for ns/c/k behind the hold, on a session of a 2 s TTL.
    let ran = s.dir.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let waiting = tokio::spawn({
        let url = s.url.clone();
        let args: Vec<String> = [
            "lock",
            "run",
            "ns/c/k",
            "--ttl",
            "2",
            "--wait-ms",
            "60000",
            "--service",
            url.as_str(),
            "--dev-identity",
            JOB,
            "--",
            "sh",
            "-c",
            touch.as_str(),
        ]
        .map(String::from)
        .into();
        async move { tokio::time::timeout(Duration::from_secs(30), run(args, &[])).await }
    });
    let name = LockName::new("ns", "c", "k");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.locker.lock_state(&name).await.unwrap().waiters.is_empty() {
        if waiting.is_finished() {
            panic!("lock run ended before it queued: {:?}", waiting.await);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lock run never queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stopped = Stopped::new(&s);
    let hold = hold_file.to_str().unwrap();
    let bound = Duration::from_secs(20);
    let release = ["lock", "release", "--hold", hold];
    let keepalive = ["session", "keepalive", &session, "--timeout-ms", "2000"];
    let status = ["lock", "status", "ns/c/k", "--timeout-ms", "2000"];
    let acquire = [
        "lock",
        "acquire",
        "ns/c/k2",
        "--wait-ms",
        "500",
        "--timeout-ms",
        "2000",
    ];
    let acquire_on = [
        "lock",
        "acquire",
        "ns/c/k2",
        "--session",
        &session,
        "--wait-ms",
        "500",
        "--timeout-ms",
        "2000",
    ];
    let run_new = [
        "lock",
        "run",
        "ns/c/k3",
        "--timeout-ms",
        "2000",
        "--",
        "sh",
        "-c",
        &touch,
    ];
    let (release, keepalive, status, acquire, acquire_on, run_new, run_waiting) = tokio::join!(
        // The release is sent again for 10 s, then the close gets a last second.
        within(&s, bound, &release),
        within(&s, bound, &keepalive),
        within(&s, bound, &status),
        // No session could be opened: nothing was asked of the lock.
        within(&s, bound, &acquire),
        // On an open session: the acquire was sent, its outcome is unknown.
        within(&s, bound, &acquire_on),
        within(&s, bound, &run_new),
        async { waiting.await.unwrap() },
    );
    drop(stopped);

    release.fails(74, "outcome is unknown");
    keepalive.fails(1, "no answer from the lock service");
    status.fails(1, "no answer from the lock service");
    acquire.fails(1, "opening a session for the acquire: no answer");
    let acquire_on = acquire_on.fails(74, "outcome is unknown");
    assert!(acquire_on.stderr.contains(&session), "{acquire_on:?}");
    run_new.fails(1, "opening a session for lock run: no answer");
    // The waiting run's session went unrenewed for a TTL: lost, exit 76.
    let run_waiting = run_waiting.expect("the waiting lock run did not return");
    assert_eq!(run_waiting.code, 76, "{run_waiting:?}");
    assert!(
        run_waiting
            .stderr
            .contains("the session ended while waiting for the lock"),
        "{run_waiting:?}"
    );
    assert!(!ran.exists(), "a command ran without its lock");
}
