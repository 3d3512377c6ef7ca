//! The `palisade` binary against a real `palisade serve` (mTLS with rcgen-made
//! certificates, or dev mode) on real etcd and, for force release, a real PostgreSQL
//! database: every command's happy path and its typed failure, by exit code and
//! message. Every test here starts etcd: `etcd` in each name.

mod common;

use std::ffi::OsStr;
use std::time::Duration;

use common::pki::Pki;
use common::service::{run, Mode, Service, ADMIN, ADMIN2, JOB, JOB2};
use palisade_lock::LockName;
use palisade_testkit::TestDb;

fn token(v: &serde_json::Value) -> u64 {
    v["token"].as_str().expect("a token").parse().unwrap()
}

#[tokio::test]
async fn etcd_cli_over_mtls_acquires_releases_and_refuses_typed() {
    let s = Service::start(Mode::Mtls, None).await;
    let job = s.svid("job", &[JOB]);
    let job2 = s.svid("job2", &[JOB2]);
    let name = LockName::new("ns", "c", "jobs/nightly");

    // No identity at all, or both kinds: bad input, before anything is sent.
    run(
        vec!["lock", "acquire", "ns/c/jobs/nightly", "--service", &s.url],
        &[],
    )
    .await
    .fails(2, "no caller identity");
    let both = s
        .tls(&job, &["lock", "status", "ns/c/x", "--dev-identity", JOB])
        .await;
    both.fails(2, "choose one");
    run(vec!["lock", "status", "ns/c/x", "--dev-identity", JOB], &[])
        .await
        .fails(2, "no lock service");

    // Acquire with the connection from the environment: prints the hold and exits.
    let ca = s.ca();
    let env: Vec<(&str, &OsStr)> = vec![
        ("PALISADE_SERVICE", OsStr::new(&s.url)),
        ("PALISADE_CERT", job.cert.as_os_str()),
        ("PALISADE_KEY", job.key.as_os_str()),
        ("PALISADE_CA", ca.as_os_str()),
    ];
    let out = run(
        vec!["lock", "acquire", "ns/c/jobs/nightly", "--ttl", "20"],
        &env,
    )
    .await
    .ok();
    let hold = out.json();
    assert_eq!(hold["mode"], "exclusive");
    assert_eq!(hold["own_session"], true);
    assert_eq!(hold["ttl_ms"], 20_000);
    assert_eq!(hold["enforcement"], "fenced");
    let t1 = token(&hold);
    assert_eq!(t1 & ((1 << 48) - 1), hold["grant_rev"].as_u64().unwrap());
    let hold_file = s.dir.path().join("hold.json");
    std::fs::write(&hold_file, &out.stdout).unwrap();
    let hold_path = hold_file.to_str().unwrap();

    // The process is gone, the hold stays, owned by the certificate's SPIFFE ID.
    let state = s.locker.lock_state(&name).await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].spiffe_id, JOB);
    assert_eq!(state.holders[0].token.get(), t1);
    let status = s
        .tls(&job2, &["lock", "status", "ns/c/jobs/nightly"])
        .await
        .ok();
    assert_eq!(status.json()["holders"][0]["token"], t1.to_string());

    // Another identity waits in vain (75), and may not release the hold (7).
    s.tls(
        &job2,
        &["lock", "acquire", "ns/c/jobs/nightly", "--wait-ms", "300"],
    )
    .await
    .fails(75, "deadline-exceeded");
    s.tls(&job2, &["lock", "release", "--hold", hold_path])
        .await
        .fails(7, "403");
    s.tls(
        &job2,
        &["session", "keepalive", hold["session"].as_str().unwrap()],
    )
    .await
    .fails(7, "another identity");
    // A certificate without a SPIFFE ID (401), or from another CA (handshake refused).
    let anon = s.svid("anon", &[]);
    s.tls(&anon, &["lock", "status", "ns/c/jobs/nightly"])
        .await
        .fails(6, "401");
    let rogue = Pki::new("rogue")
        .client(&[JOB])
        .files(s.dir.path(), "rogue");
    s.tls(&rogue, &["lock", "status", "ns/c/jobs/nightly"])
        .await
        .fails(6, "refused the TLS handshake");
    // A malformed hold file: bad input, nothing released.
    let junk = s.dir.path().join("junk.json");
    std::fs::write(&junk, "{\"session\": 1}").unwrap();
    s.tls(&job, &["lock", "release", "--hold", junk.to_str().unwrap()])
        .await
        .fails(2, "not a hold printed by `lock acquire`");
    assert_eq!(s.locker.lock_state(&name).await.unwrap().holders.len(), 1);

    // The owner renews and releases; the session lock acquire opened is closed too.
    let session = hold["session"].as_str().unwrap();
    let renewed = s.tls(&job, &["session", "keepalive", session]).await.ok();
    assert_eq!(renewed.json()["ttl_ms"], 20_000);
    let out = s
        .tls(&job, &["lock", "release", "--hold", hold_path])
        .await
        .ok();
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(s.locker.lock_state(&name).await.unwrap().holders.is_empty());
    s.tls(&job, &["session", "keepalive", session])
        .await
        .fails(76, "the session is gone");
    s.tls(&job, &["lock", "release", "--hold", hold_path])
        .await
        .fails(76, "the hold already ended: its session is gone");

    // The other identity now gets it, with a higher token, on a session of its own,
    // and releases by the explicit form.
    let out = s.tls(&job2, &["session", "open", "--ttl", "20"]).await.ok();
    let own = out.json()["session"].as_str().unwrap().to_owned();
    let h2 = s
        .tls(
            &job2,
            &["lock", "acquire", "ns/c/jobs/nightly", "--session", &own],
        )
        .await
        .ok()
        .json();
    assert!(token(&h2) > t1);
    assert_eq!(h2["own_session"], false);
    let rev = h2["grant_rev"].as_u64().unwrap().to_string();
    let release = |rev: &str| {
        [
            "lock",
            "release",
            "ns/c/jobs/nightly",
            "--session",
            &own,
            "--grant-rev",
            rev,
        ]
        .map(str::to_owned)
    };
    // A grant revision that is not the hold's releases nothing, and says so.
    let wrong = release("1");
    s.tls(&job2, &wrong.each_ref().map(String::as_str))
        .await
        .fails(
            76,
            "the session holds no ns/c/jobs/nightly granted at revision 1: the hold already \
             ended, or that is not its grant revision",
        );
    let right = release(&rev);
    s.tls(&job2, &right.each_ref().map(String::as_str))
        .await
        .ok();
    // The session was not closed by that release; `session close` ends it.
    s.tls(&job2, &["session", "keepalive", &own]).await.ok();
    s.tls(&job2, &["session", "close", &own]).await.ok();
    s.tls(&job2, &["session", "keepalive", &own])
        .await
        .fails(76, "gone");
    // `lock run` over mTLS: the command sees the token, and the lock is free after.
    let seen = s.dir.path().join("token");
    let script = format!("echo $FENCING_TOKEN > {}", seen.display());
    s.tls(
        &job,
        &[
            "lock",
            "run",
            "ns/c/jobs/nightly",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .await
    .ok();
    let t3: u64 = std::fs::read_to_string(&seen)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(t3 > token(&h2));
    let state = s.locker.lock_state(&name).await.unwrap();
    assert!(
        state.holders.is_empty() && state.waiters.is_empty(),
        "{state:?}"
    );
}

#[tokio::test]
async fn etcd_cli_acquired_hold_lives_by_keepalive_and_lapses_without() {
    let s = Service::start(Mode::Dev, None).await;
    let name = LockName::new("ns", "c", "k");
    // Bad input is refused with exit 2 and the service's reason; nothing is held.
    s.dev(JOB, &["lock", "acquire", "ns/c/k", "--ttl", "0"])
        .await
        .fails(
            2,
            "session TTL 0 s is not a whole number of seconds from 1 to 3600 s",
        );
    s.dev(JOB, &["lock", "acquire", "ns/c/k", "--wait-ms", "3600001"])
        .await
        .fails(2, "wait_ms must be");
    s.dev(
        JOB,
        &["lock", "acquire", "ns/c/k", "--ttl", "99999999999999999"],
    )
    .await
    .fails(
        2,
        "session TTL 99999999999999999 s is not a whole number of seconds from 1 to 3600 s",
    );
    s.dev(JOB, &["lock", "acquire", "ns/c/", "--wait-ms", "100"])
        .await
        .fails(2, "invalid-input");
    s.dev(JOB, &["session", "keepalive", "not-a-session"])
        .await
        .fails(2, "16 lower-case hex digits");
    let state = s.locker.lock_state(&name).await.unwrap();
    assert!(state.holders.is_empty() && state.waiters.is_empty());
    // A class whose shortest TTL is 1 s; a 2 s session renewed every second outlives
    // several TTLs.
    s.dev(JOB, &["lock", "acquire", "ns/c/k", "--holder-meta", "[1]"])
        .await
        .fails(2, "holder_meta must be a JSON object");
    s.dev(
        JOB,
        &["lock", "acquire", "ns/c/k", "--holder-meta", "{host"],
    )
    .await
    .fails(2, "--holder-meta is not JSON");
    let big = format!("{{\"k\":\"{}\"}}", "x".repeat(1100));
    s.dev(JOB, &["lock", "acquire", "ns/c/k", "--holder-meta", &big])
        .await
        .fails(2, "more than 1024");
    let meta = r#"{"host":"build-7","pid":4242}"#;
    let hold = s
        .dev(
            JOB,
            &[
                "lock",
                "acquire",
                "ns/c/k",
                "--ttl",
                "2",
                "--holder-meta",
                meta,
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(
        hold["holder_meta"],
        serde_json::json!({"host": "build-7", "pid": 4242})
    );
    let status = s.dev(JOB2, &["lock", "status", "ns/c/k"]).await.ok().json();
    assert_eq!(status["holders"][0]["holder_meta"], hold["holder_meta"]);
    let session = hold["session"].as_str().unwrap().to_owned();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(900)).await;
        s.dev(JOB, &["session", "keepalive", &session]).await.ok();
    }
    let state = s.locker.lock_state(&name).await.unwrap();
    assert_eq!(
        state.holders.len(),
        1,
        "kept alive past 3.6 s with a 2 s TTL"
    );
    assert_eq!(state.holders[0].token.get(), token(&hold));
    // Not renewed: the hold lapses with its session, and anyone may take the lock.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while !s.locker.lock_state(&name).await.unwrap().holders.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hold never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = s
        .dev(JOB2, &["lock", "acquire", "ns/c/k", "--wait-ms", "3000"])
        .await
        .ok()
        .json();
    assert!(token(&next) > token(&hold));
    // Releasing the lapsed hold from stdin: it already ended.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["lock", "release", "--hold", "-", "--service", &s.url])
        .args(["--dev-identity", JOB])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(hold.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already ended"));
}

#[tokio::test]
async fn etcd_cli_acquire_keeps_the_session_it_opened_alive_while_it_waits() {
    let s = Service::start(Mode::Dev, None).await;
    let first = s
        .dev(JOB, &["lock", "acquire", "ns/c/wait", "--ttl", "30"])
        .await
        .ok();
    let hold_path = s.dir.path().join("first-hold.json");
    std::fs::write(&hold_path, &first.stdout).unwrap();
    let waiting = s.dev(
        JOB2,
        &[
            "lock",
            "acquire",
            "ns/c/wait",
            "--ttl",
            "2",
            "--wait-ms",
            "15000",
        ],
    );
    let release = async {
        // Well past the waiter's 2 s TTL: its session lives only if the waiting
        // command renews it.
        tokio::time::sleep(Duration::from_secs(5)).await;
        s.dev(
            JOB,
            &["lock", "release", "--hold", hold_path.to_str().unwrap()],
        )
        .await
        .ok();
    };
    let (granted, ()) = tokio::join!(waiting, release);
    let granted = granted.ok().json();
    assert!(token(&granted) > token(&first.json()));
    assert_eq!(granted["ttl_ms"], 2000);
}

#[tokio::test]
async fn etcd_cli_admin_namespaces_classes_and_epochs() {
    let s = Service::start(Mode::Dev, None).await;
    // Namespaces: create, refuse to create twice, update only what is given, list.
    s.dev(JOB, &["namespace", "create", "x", "--tenant", "acme"])
        .await
        .fails(7, "only service admins");
    let n = s
        .dev(
            ADMIN,
            &[
                "namespace",
                "create",
                "x",
                "--tenant",
                "acme",
                "--op-rate-quota",
                "50",
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(
        (n["id"].as_str(), n["op_rate_quota"].as_u64()),
        (Some("x"), Some(50))
    );
    s.dev(ADMIN, &["namespace", "create", "x", "--tenant", "other"])
        .await
        .fails(4, "exists");
    let n = s
        .dev(
            ADMIN,
            &["namespace", "update", "x", "--held-lease-quota", "7"],
        )
        .await
        .ok()
        .json();
    assert_eq!(n["tenant_id"], "acme", "update keeps what it was not given");
    assert_eq!(n["op_rate_quota"], 50);
    assert_eq!(n["held_lease_quota"], 7);
    s.dev(ADMIN, &["namespace", "update", "nope", "--tenant", "t"])
        .await
        .fails(3, "no namespace");
    s.dev(ADMIN, &["namespace", "create", "Bad Name", "--tenant", "t"])
        .await
        .fails(2, "namespace \"Bad Name\": name \"Bad Name\" is not");
    let list = s.dev(ADMIN, &["namespace", "list"]).await.ok().json();
    let ids: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["ns", "x"]);
    assert_eq!(
        s.dev(JOB, &["namespace", "list"]).await.ok().json(),
        serde_json::json!([])
    );

    // Classes.
    let c = s
        .dev(
            ADMIN,
            &[
                "class",
                "create",
                "x",
                "rows",
                "--prefix",
                "row/",
                "--mode",
                "shared",
                "--lock-delay-ms",
                "500",
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(
        (c["key_prefix"].as_str(), c["mode"].as_str()),
        (Some("row/"), Some("shared"))
    );
    s.dev(ADMIN, &["class", "create", "x", "rows"])
        .await
        .fails(4, "exists");
    let c = s
        .dev(
            ADMIN,
            &[
                "class",
                "update",
                "x",
                "rows",
                "--enforcement",
                "advisory",
                "--ttl-max-ms",
                "5000",
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(c["enforcement"], "advisory");
    assert_eq!(c["mode"], "shared", "update keeps what it was not given");
    assert_eq!(c["lock_delay"], 500);
    assert_eq!(c["ttl_max"], 5000);
    s.dev(ADMIN, &["class", "update", "x", "cols", "--mode", "shared"])
        .await
        .fails(3, "no class");
    s.dev(ADMIN, &["class", "create", "x", "cols", "--mode", "both"])
        .await
        .fails(2, "invalid value 'both'");
    s.dev(JOB, &["class", "list", "x"]).await.fails(7, "403");
    let list = s.dev(ADMIN, &["class", "list", "x"]).await.ok().json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["enforcement"], "advisory");

    // Lock status of what does not exist: not found.
    s.dev(JOB, &["lock", "status", "nope/c/k"])
        .await
        .fails(7, "403");
    s.dev(ADMIN, &["lock", "status", "nope/c/k"])
        .await
        .fails(3, "404");
    s.dev(JOB, &["lock", "status", "no-slashes"])
        .await
        .fails(2, "is not NAMESPACE/CLASS/KEY");

    // Epochs.
    s.dev(JOB, &["epoch", "show"])
        .await
        .fails(7, "only service admins");
    let e = s.dev(ADMIN, &["epoch", "show"]).await.ok().json();
    assert_eq!(e["epoch"], 0);
    s.dev(ADMIN, &["epoch", "advance", "--reason", "because"])
        .await
        .fails(2, "invalid value 'because'");
    let e = s
        .dev(ADMIN, &["epoch", "advance", "--reason", "restore"])
        .await
        .ok()
        .json();
    assert_eq!(
        (e["epoch"].as_u64(), e["reason"].as_str()),
        (Some(1), Some("restore"))
    );
    let e = s.dev(ADMIN2, &["epoch", "show"]).await.ok().json();
    assert_eq!(e["epoch"], 1);
    // Tokens from now on carry the new epoch.
    let hold = s.dev(JOB, &["lock", "acquire", "ns/c/k"]).await.ok().json();
    assert_eq!(token(&hold) >> 48, 1);

    // A quota lowered to the one hold there is: the next acquire is refused (exit 5),
    // and the session opened for it is closed again.
    s.dev(
        ADMIN,
        &["namespace", "update", "ns", "--held-lease-quota", "1"],
    )
    .await
    .ok();
    s.dev(JOB, &["lock", "acquire", "ns/c/k2"])
        .await
        .fails(5, "held_lease_quota");
    let state = s
        .locker
        .lock_state(&LockName::new("ns", "c", "k2"))
        .await
        .unwrap();
    assert!(state.holders.is_empty() && state.waiters.is_empty());
}

#[tokio::test]
async fn etcd_cli_force_release_needs_a_second_admin() {
    let db = TestDb::create().await;
    let s = Service::start(Mode::Dev, Some(db.connection_string())).await;
    let hold = s
        .dev(JOB, &["lock", "acquire", "ns/c/jobs/stuck"])
        .await
        .ok()
        .json();
    s.dev(
        JOB,
        &[
            "force-release",
            "request",
            "ns/c/jobs/stuck",
            "--reason",
            "wedged",
        ],
    )
    .await
    .fails(7, "only admins of the namespace");
    s.dev(
        ADMIN,
        &[
            "force-release",
            "request",
            "ns/c/jobs/stuck",
            "--reason",
            " ",
        ],
    )
    .await
    .fails(2, "reason is blank");
    let req = s
        .dev(
            ADMIN,
            &[
                "force-release",
                "request",
                "ns/c/jobs/stuck",
                "--reason",
                "wedged",
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(req["requester"], ADMIN);
    let id = req["id"].as_str().unwrap();
    // The requester cannot approve; nothing was deleted.
    s.dev(ADMIN, &["force-release", "approve", id])
        .await
        .fails(7, "the requester cannot approve it");
    let name = LockName::new("ns", "c", "jobs/stuck");
    assert_eq!(s.locker.lock_state(&name).await.unwrap().holders.len(), 1);
    s.dev(ADMIN2, &["force-release", "approve", "no-such-request"])
        .await
        .fails(3, "no force release request");
    let done = s
        .dev(ADMIN2, &["force-release", "approve", id])
        .await
        .ok()
        .json();
    assert_eq!(done["approver"], ADMIN2);
    assert_eq!(done["released"][0]["token"], hold["token"]);
    assert!(s.locker.lock_state(&name).await.unwrap().holders.is_empty());
    s.dev(ADMIN2, &["force-release", "approve", id])
        .await
        .fails(4, "already approved");
    // The old holder learns on release that the hold is gone.
    let file = s.dir.path().join("hold.json");
    std::fs::write(&file, hold.to_string()).unwrap();
    s.dev(JOB, &["lock", "release", "--hold", file.to_str().unwrap()])
        .await
        .fails(76, "already ended");

    // A request naming one grant (--grant-rev) whose hold was released and acquired
    // again before approval releases nothing: exit 4, the new hold stays.
    let hold = s
        .dev(JOB, &["lock", "acquire", "ns/c/jobs/stuck"])
        .await
        .ok()
        .json();
    let grant_rev = hold["grant_rev"].to_string();
    let req = s
        .dev(
            ADMIN,
            &[
                "force-release",
                "request",
                "ns/c/jobs/stuck",
                "--reason",
                "wedged",
                "--grant-rev",
                &grant_rev,
            ],
        )
        .await
        .ok()
        .json();
    assert_eq!(req["targets"][0]["grant_rev"], hold["grant_rev"]);
    std::fs::write(&file, hold.to_string()).unwrap();
    s.dev(JOB, &["lock", "release", "--hold", file.to_str().unwrap()])
        .await
        .ok();
    s.dev(JOB, &["lock", "acquire", "ns/c/jobs/stuck"])
        .await
        .ok();
    s.dev(
        ADMIN2,
        &["force-release", "approve", req["id"].as_str().unwrap()],
    )
    .await
    .fails(4, "force-target-gone");
    assert_eq!(s.locker.lock_state(&name).await.unwrap().holders.len(), 1);
}

#[tokio::test]
async fn etcd_cli_force_release_is_not_found_without_a_database() {
    let s = Service::start(Mode::Dev, None).await;
    s.dev(
        ADMIN,
        &["force-release", "request", "ns/c/k", "--reason", "r"],
    )
    .await
    .fails(3, "not configured");
}

#[tokio::test]
async fn etcd_cli_interrupted_acquire_closes_its_session() {
    stopped_acquire_closes_its_session(nix::sys::signal::Signal::SIGINT, 130, "interrupted").await;
}

/// A supervisor stops a waiting `lock acquire` with SIGTERM: as with SIGINT, its session
/// is closed on the way out (no waiter, no session slot left), exit 143.
#[tokio::test]
async fn etcd_cli_terminated_acquire_closes_its_session() {
    stopped_acquire_closes_its_session(nix::sys::signal::Signal::SIGTERM, 143, "terminated").await;
}

async fn stopped_acquire_closes_its_session(
    signal: nix::sys::signal::Signal,
    code: i32,
    says: &str,
) {
    let s = Service::start(Mode::Dev, None).await;
    let name = LockName::new("ns", "c", "k");
    let first = s.dev(JOB, &["lock", "acquire", "ns/c/k"]).await.ok().json();
    let waiting = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["lock", "acquire", "ns/c/k", "--wait-ms", "30000"])
        .args(["--service", &s.url, "--dev-identity", JOB2])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.locker.lock_state(&name).await.unwrap().waiters.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = nix::unistd::Pid::from_raw(waiting.id().unwrap() as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), waiting.wait_with_output())
        .await
        .expect("acquire did not stop on the signal")
        .unwrap();
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(says),
        "{out:?}"
    );
    assert!(out.stdout.is_empty());
    // Its session was closed on the way out: no waiter is left, and the lock goes
    // straight to the next one once the first holder releases.
    let state = s.locker.lock_state(&name).await.unwrap();
    assert!(state.waiters.is_empty(), "{state:?}");
    assert_eq!(state.holders.len(), 1);
    let file = s.dir.path().join("first.json");
    std::fs::write(&file, first.to_string()).unwrap();
    s.dev(JOB, &["lock", "release", "--hold", file.to_str().unwrap()])
        .await
        .ok();
    let next = s
        .dev(JOB2, &["lock", "acquire", "ns/c/k", "--wait-ms", "1000"])
        .await
        .ok()
        .json();
    assert!(token(&next) > token(&first));
}

#[tokio::test]
async fn etcd_cli_release_whose_answer_is_lost_is_sent_again_and_an_unknown_outcome_exits_74() {
    use palisade_testkit::{Loss, LossyProxy};

    let s = Service::start(Mode::Dev, None).await;
    let upstream: std::net::SocketAddr = s.url.trim_start_matches("http://").parse().unwrap();
    let proxy = LossyProxy::start(upstream).await;
    let via_proxy = format!("http://{}", proxy.addr());
    let cli = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend([
            "--service".into(),
            via_proxy.clone(),
            "--dev-identity".into(),
            JOB.into(),
        ]);
        run(all, &[])
    };
    let name = LockName::new("ns", "c", "k");
    let hold_file = s.dir.path().join("hold.json");
    let hold_path = hold_file.to_str().unwrap();

    // The release commits, its answer is lost: sent again, the hold is gone, exit 0.
    let out = cli(&["lock", "acquire", "ns/c/k", "--ttl", "30"])
        .await
        .ok();
    std::fs::write(&hold_file, &out.stdout).unwrap();
    proxy.set(Loss::NextAnswer);
    cli(&["lock", "release", "--hold", hold_path]).await.ok();
    assert_eq!(proxy.loss(), Loss::None, "the answer was lost once");
    assert!(s.locker.lock_state(&name).await.unwrap().holders.is_empty());

    // Nothing gets through for the whole budget: exit 74, the hold still held.
    let out = cli(&["lock", "acquire", "ns/c/k", "--ttl", "30"])
        .await
        .ok();
    std::fs::write(&hold_file, &out.stdout).unwrap();
    proxy.set(Loss::Everything);
    cli(&["lock", "release", "--hold", hold_path])
        .await
        .fails(74, "outcome is unknown");
    assert_eq!(s.locker.lock_state(&name).await.unwrap().holders.len(), 1);
    // Run again once the service answers: released.
    proxy.set(Loss::None);
    cli(&["lock", "release", "--hold", hold_path]).await.ok();
    assert!(s.locker.lock_state(&name).await.unwrap().holders.is_empty());
}

/// Runs `palisade ARGS --service URL --dev-identity JOB` with its stdout a pipe whose
/// reader has already gone; the exit code and stderr.
async fn into_closed_pipe(s: &Service, args: &[&str]) -> (i32, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .args(["--service", &s.url, "--dev-identity", JOB])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn etcd_cli_closed_stdout_releases_the_hold_it_could_not_hand_over() {
    let s = Service::start(Mode::Dev, None).await;
    let name = LockName::new("ns", "c", "jobs/nightly");
    let (code, err) = into_closed_pipe(&s, &["lock", "acquire", "ns/c/jobs/nightly"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot write the hold to stdout") && err.contains("released it"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // Nobody received the hold, so nobody holds the lock (its 30 s TTL did not pass).
    let state = s.locker.lock_state(&name).await.unwrap();
    assert!(state.holders.is_empty(), "{state:?}");
    let (code, err) = into_closed_pipe(&s, &["lock", "status", "ns/c/jobs/nightly"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot write to stdout"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn etcd_cli_first_steps_refusals_say_what_to_pass() {
    let s = Service::start(Mode::Dev, None).await;
    // Class `c` has the default, empty prefix: it covers every key of `ns`.
    s.dev(
        ADMIN,
        &["class", "create", "ns", "d", "--prefix", "invoice-"],
    )
    .await
    .fails(2, "class ns/c has the empty key prefix")
    .fails(2, "palisade class update ns c --prefix c-");
    s.dev(ADMIN, &["class", "update", "ns", "c", "--prefix", "c-"])
        .await
        .ok();
    s.dev(ADMIN, &["class", "create", "ns", "d"]).await.fails(
        2,
        "with no --prefix (or an empty one), class d would take the empty key prefix",
    );
    s.dev(ADMIN, &["class", "create", "ns", "d", "--prefix", "c-x"])
        .await
        .fails(2, "overlaps class ns/c's prefix \"c-\"");
    s.dev(ADMIN, &["class", "create", "ns", "d", "--prefix", "d-"])
        .await
        .ok();
    // A TTL above the class's bounds names them plainly.
    let out = s
        .dev(JOB, &["lock", "acquire", "ns/c/c-1", "--ttl", "3600"])
        .await
        .fails(2, "outside the class's TTL bounds, from 1s to 60s");
    assert!(!out.stderr.contains("..="), "{out:?}");
    // A dev-mode service asks a caller without identity for the dev header.
    let addr = s.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    write!(
        stream,
        "GET /v1/namespaces HTTP/1.0\r\nHost: {addr}\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 401 "), "{response}");
    assert!(response.contains("x-palisade-dev-identity"), "{response}");
    assert!(!response.contains("client certificate"), "{response}");
}

/// Each refusal names the thing and the cause: a namespace that does not exist, a
/// session id of no session, an empty name, a class field out of the service's range
/// (the CLI's TTL range text is the service's), and a 403 names the identity and what
/// it was refused.
#[tokio::test]
async fn etcd_cli_refusals_name_the_thing_and_the_cause() {
    let s = Service::start(Mode::Dev, None).await;
    s.dev(ADMIN, &["namespace", "rehome", "nope", "--to", "default"])
        .await
        .fails(3, "404 not-found: namespace \"nope\" does not exist");
    s.dev(ADMIN, &["lock", "acquire", "nope/c/k"])
        .await
        .fails(3, "404 not-found: namespace \"nope\" does not exist");
    // A well-formed id of no session.
    let none = "0000000000000000";
    for args in [
        &["lock", "acquire", "ns/c/k", "--session", none][..],
        &["session", "keepalive", none][..],
    ] {
        let out = s.dev(JOB, args).await;
        assert!(
            out.stderr
                .contains("no live session 0000000000000000 (expired, closed or never opened)"),
            "{args:?}: {out:?}"
        );
        assert!(out.code == 3 || out.code == 76, "{args:?}: {out:?}");
    }
    // Empty names are refused before anything is sent.
    s.dev(ADMIN, &["namespace", "create", "", "--tenant", "t"])
        .await
        .fails(2, "the namespace name is empty");
    s.dev(ADMIN, &["class", "create", "ns", ""])
        .await
        .fails(2, "the class name is empty");
    // Class fields within the service's limits, named by flag and range.
    s.dev(
        ADMIN,
        &["class", "update", "ns", "c", "--ttl-max-ms", "3600001"],
    )
    .await
    .fails(2, "--ttl-max-ms")
    .fails(
        2,
        "ttl_max_ms 3600001 is above 3600000 (ms; from 0 to 3600 s)",
    );
    s.dev(
        ADMIN,
        &[
            "class",
            "update",
            "ns",
            "c",
            "--lock-delay-ms",
            "99999999999",
        ],
    )
    .await
    .fails(2, "--lock-delay-ms")
    .fails(
        2,
        "lock_delay_ms 99999999999 is above 3600000 (ms; from 0 to 3600 s)",
    );
    let put = palisade_client::Client::new(s.url.clone())
        .unwrap()
        .with_dev_identity(ADMIN)
        .call_json(
            "PUT",
            "/v1/namespaces/ns/classes/c",
            Some(serde_json::json!({ "lock_delay_ms": 3_600_001u64 })),
        )
        .await
        .unwrap_err();
    assert_eq!(put.status(), Some(400), "{put:?}");
    assert_eq!(
        put.detail(),
        "lock_delay_ms 3600001 is above 3600000 (ms; from 0 to 3600 s)"
    );
    // The session TTL: the CLI's range is the service's.
    let cli = s
        .dev(JOB, &["session", "open", "--ttl", "3601"])
        .await
        .fails(2, "--ttl");
    let service = palisade_client::Client::new(s.url.clone())
        .unwrap()
        .with_dev_identity(JOB)
        .call_json(
            "POST",
            "/v1/sessions",
            Some(serde_json::json!({ "ttl_ms": 3_601_000u64 })),
        )
        .await
        .unwrap_err();
    let range = "is not a whole number of seconds from 1 to 3600 s";
    assert!(cli.stderr.contains(range), "{cli:?}");
    assert!(service.detail().contains(range), "{service:?}");
    // 403: who, and what.
    s.dev(JOB2, &["class", "list", "ns"])
        .await
        .fails(
            7,
            "spiffe://test/jobs/b may not list the classes of namespace ns: only admins of the namespace do",
        );
    s.dev("spiffe://test/nobody", &["lock", "acquire", "ns/c/k"])
        .await
        .fails(7, "spiffe://test/nobody may not use namespace ns");
}
