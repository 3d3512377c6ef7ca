//! The whole fenced system on one machine, and a stale writer being stopped. Run it with
//! `scripts/demo` (which installs what is missing and builds everything first).
//!
//! It starts, in a temporary directory, on free loopback ports: a three-member etcd, the
//! lock service (`palisade serve`, dev mode), the audit tailer and dashboard, a fenced
//! service and an advisory one (`examples/protected_service.rs`), and two workers
//! (`examples/worker.rs`, separate processes). It uses a fresh database on the local
//! PostgreSQL (`PALISADE_PG_ADMIN`, default `host=127.0.0.1 port=5432 user=postgres`),
//! `palisade_demo_<pid>`, dropped at the end; first it drops those a killed demo left
//! behind (see [`procs::sweep_databases`]). Then it plays the scenario over real HTTP,
//! step by step.
//!
//! Flags: `--keep-running` leaves everything up until Ctrl-C; `--summary FILE` writes the
//! outcome as JSON (for the end-to-end test). Every process it started is stopped before
//! it exits, also on Ctrl-C, SIGTERM, SIGHUP or a failed step.
//!
//! etcd is the `etcd` that `PALISADE_ETCD` names, else the one on `PATH`; its three
//! members are started as the tests start theirs (every member healthy before the demo
//! goes on, ports another process took replaced). Every wait is bounded: a step that does
//! not finish in its time fails the demo with the step named and each process's log tail
//! (`PALISADE_DEMO_SHOW_LOGS=1`), and the whole scenario gets [`SCENARIO_LIMIT`].

mod procs;
mod workers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use procs::{
    announced, bounded, command, drop_database, free_port, pg, pg_batch, wait_port, Procs,
};
use workers::{Tally, Worker};

type Error = Box<dyn std::error::Error + Send + Sync>;

const LOCK: &str = "orders/invoices/invoice-42";
const RESOURCE: &str = "/orders/invoice-42";

/// The whole scenario's limit, start-up included (it takes 5 to 15 s).
const SCENARIO_LIMIT: Duration = Duration::from_secs(180);
/// A database statement's, an HTTP request's or an admin command's limit.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// The step the scenario is at (0 while starting), for a timeout's message.
static STEP: AtomicU32 = AtomicU32::new(0);

fn step(n: u32, text: &str) {
    STEP.store(n, Ordering::Relaxed);
    println!("\n[{n}] {text}");
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let keep_running = args.iter().any(|a| a == "--keep-running");
    let summary = args
        .iter()
        .position(|a| a == "--summary")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let admin = std::env::var("PALISADE_PG_ADMIN")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres".into());
    let dbname = format!("palisade_demo_{}", std::process::id());
    let mut procs = Procs::default();
    let dir = match tempfile::Builder::new().prefix("palisade-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("demo: no temporary directory: {e}");
            std::process::exit(1);
        }
    };
    let scenario = tokio::time::timeout(
        SCENARIO_LIMIT,
        run(&mut procs, dir.path(), &admin, &dbname, keep_running),
    );
    let result = tokio::select! {
        r = scenario => r.unwrap_or_else(|_| Err(format!(
            "the scenario did not finish in {} s (it was at step {})",
            SCENARIO_LIMIT.as_secs(),
            STEP.load(Ordering::Relaxed)
        ).into())).map_err(Stop::Failed),
        signal = interrupted() => Err(Stop::Signal(signal)),
    };
    if keep_running && result.is_ok() {
        let _ = interrupted().await;
    }
    let pids = procs.pids();
    let etcd_logs = procs.etcd_logs();
    println!("\nstopping {} processes", pids.len());
    procs.stop_all().await;
    if let Err(e) = drop_database(&admin, &dbname).await {
        eprintln!("demo: could not drop database {dbname}: {e}");
    }
    match result {
        Ok(mut outcome) => {
            outcome["pids"] = json!(pids);
            if let Some(path) = summary {
                if let Err(e) = std::fs::write(&path, outcome.to_string()) {
                    eprintln!("demo: writing {}: {e}", path.display());
                    std::process::exit(1);
                }
            }
        }
        Err(Stop::Signal((name, number))) => {
            // Asked to stop: nothing failed, so the logs go with the rest.
            eprintln!("\ndemo stopped by {name}");
            drop(dir);
            std::process::exit(128 + number);
        }
        Err(Stop::Failed(e)) => {
            eprintln!("\ndemo failed: {e}\n(logs are in {})", dir.path().display());
            if std::env::var_os("PALISADE_DEMO_SHOW_LOGS").is_some() {
                for entry in std::fs::read_dir(dir.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if entry.path().extension().is_some_and(|x| x == "log") {
                        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(20).collect();
                        eprintln!("--- {} ---", entry.path().display());
                        for l in tail.iter().rev() {
                            eprintln!("{l}");
                        }
                    }
                }
                for (member, tail) in etcd_logs {
                    eprintln!("--- {member} ---\n{tail}");
                }
            }
            std::process::exit(1);
        }
    }
}

async fn run(
    procs: &mut Procs,
    dir: &Path,
    admin: &str,
    dbname: &str,
    keep_running: bool,
) -> Result<Value, Error> {
    let started = Instant::now();
    for name in procs::sweep_databases(admin, dbname).await? {
        println!("dropped database {name}, left by a demo that is no longer running");
    }
    let bin_dir = std::env::current_exe()?
        .parent()
        .ok_or("no exe dir")?
        .to_owned();
    let palisade = bin_dir.parent().ok_or("no target dir")?.join("palisade");
    let example = |name: &str| bin_dir.join(name);
    for p in [&palisade, &example("worker"), &example("protected_service")] {
        if !p.is_file() {
            return Err(format!(
                "{} is missing: build with `cargo build --bins --examples`",
                p.display()
            )
            .into());
        }
    }
    let etcd_version = palisade_testkit::EtcdBinaries::find()?.version();

    step(0, "starting everything on loopback");
    // Postgres: a fresh database.
    pg_batch(admin, &format!("CREATE DATABASE {dbname}")).await?;
    let database = format!("{admin} dbname={dbname}");
    println!("    postgres database {dbname}");

    // etcd: three members.
    let endpoints = procs.start_etcd().await?.endpoints();
    let etcd_list = endpoints.join(",");
    println!("    etcd {etcd_version} members {}", endpoints.join(" "));

    // The lock service.
    let authz = dir.join("authz.toml");
    std::fs::write(
        &authz,
        "admins = [\"spiffe://acme/admin\"]\n[[namespace]]\nid = \"orders\"\n[[namespace.grant]]\n\
         ids = [\"spiffe://acme/workers/\", \"spiffe://acme/nightly\"]\nclasses = [\"invoices\"]\n",
    )?;
    let lock_port = free_port()?;
    let lock_url = format!("http://127.0.0.1:{lock_port}");
    let mut cmd = command(&palisade);
    cmd.args([
        "serve",
        "--etcd",
        &etcd_list,
        "--listen",
        &format!("127.0.0.1:{lock_port}"),
        "--insecure-dev-identity",
    ])
    .arg("--config")
    .arg(&authz)
    .arg("--epoch-file")
    .arg(dir.join("epoch.json"))
    .stdout(Stdio::null());
    procs.spawn("lock-service", cmd, dir)?;
    wait_port(lock_port).await?;
    println!("    lock service {lock_url}");
    for admin_cmd in [
        vec!["namespace", "create", "orders", "--tenant", "acme"],
        vec![
            "class",
            "create",
            "orders",
            "invoices",
            "--ttl-max-ms",
            "60000",
        ],
    ] {
        let out = bounded(
            &format!("palisade {}", admin_cmd.join(" ")),
            CALL_LIMIT,
            tokio::process::Command::new(&palisade)
                .args(&admin_cmd)
                .args([
                    "--service",
                    &lock_url,
                    "--dev-identity",
                    "spiffe://acme/admin",
                ])
                .kill_on_drop(true)
                .output(),
        )
        .await?;
        if !out.status.success() {
            return Err(format!(
                "palisade {admin_cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
    }

    // Audit: tailer and dashboard.
    let mut cmd = command(&palisade);
    cmd.args(["audit", "tail", "--database", &database]);
    for e in &endpoints {
        cmd.args(["--etcd", e]);
    }
    cmd.stdout(Stdio::piped());
    announced(
        procs.spawn("audit-tailer", cmd, dir)?,
        "palisade audit tailer on",
    )
    .await?;
    let mut cmd = command(&palisade);
    cmd.args([
        "audit",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database",
        &database,
    ]);
    // etcd for the overview's holds and waiters and the timeline's tiers (read only).
    for e in &endpoints {
        cmd.args(["--etcd", e]);
    }
    cmd.stdout(Stdio::piped());
    let dashboard = announced(
        procs.spawn("audit-dashboard", cmd, dir)?,
        "palisade audit dashboard on",
    )
    .await?;
    println!("    audit dashboard {dashboard}");

    // The fenced service and the advisory one.
    let mut services = BTreeMap::new();
    for (name, advisory) in [("orders-api", false), ("reports-legacy", true)] {
        let mut cmd = command(&example("protected_service"));
        cmd.args(["--database", &database, "--name", name])
            .arg("--spool")
            .arg(dir.join(format!("{name}.spool")))
            .stdout(Stdio::piped());
        if advisory {
            cmd.arg("--advisory");
        }
        let url = announced(procs.spawn(name, cmd, dir)?, "listening on").await?;
        println!(
            "    {name} {url} ({})",
            if advisory { "advisory" } else { "fenced" }
        );
        services.insert(name, url);
    }
    let orders = services["orders-api"].clone();

    // The workers: separate processes, so that one can really be paused.
    let mut spawn_worker = |name: &'static str, ttl: u64| -> Result<Worker, Error> {
        let mut cmd = command(&example("worker"));
        cmd.args([
            "--service",
            &lock_url,
            "--identity",
            &format!("spiffe://acme/workers/{name}"),
            "--lock",
            LOCK,
        ])
        .args([
            "--target",
            &format!("{orders}{RESOURCE}"),
            "--resource",
            RESOURCE,
            "--database",
            &database,
        ])
        .args(["--ttl", &ttl.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
        let child = procs.spawn(&format!("worker-{name}"), cmd, dir)?;
        let pid = child.id().ok_or("worker exited")?;
        let stdin = child.stdin.take().ok_or("stdin")?;
        let stdout = child.stdout.take().ok_or("stdout")?;
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Ok(Worker {
            name,
            pid,
            stdin,
            events,
        })
    };
    // A's TTL is short, so the pause below outlives it; B's is long enough to ride out
    // an etcd leader election.
    let mut a = spawn_worker("a", 2)?;
    let mut b = spawn_worker("b", 10)?;
    let mut tally = Tally {
        admitted: 0,
        rejected: 0,
    };

    step(1, &format!("worker A acquires {LOCK} and writes"));
    let token_a = a.send("acquire", 1).await?[0]["token"]
        .as_u64()
        .ok_or("A got no token")?;
    println!("      worker A holds the lock with token {token_a}");
    let answers = a.send("write", 2).await?;
    tally.count("worker A", &answers);
    expect(&answers, 200, true)?;

    step(2, "worker A is paused (SIGSTOP) past its 2 s TTL");
    kill(Pid::from_raw(a.pid as i32), Signal::SIGSTOP)?;
    procs.stopped.push(a.pid);
    println!(
        "      worker A (pid {}) stopped; its session can no longer be renewed",
        a.pid
    );

    step(
        3,
        "worker B acquires the lock (it waits for A's lease to expire) and writes",
    );
    let waited = Instant::now();
    let token_b = b.send("acquire", 1).await?[0]["token"]
        .as_u64()
        .ok_or("B got no token")?;
    println!(
        "      worker B holds the lock with token {token_b} after {:.1} s (A had {token_a})",
        waited.elapsed().as_secs_f64()
    );
    if token_b <= token_a {
        return Err(format!("tokens did not increase: {token_b} <= {token_a}").into());
    }
    let answers = b.send("write", 2).await?;
    tally.count("worker B", &answers);
    expect(&answers, 200, true)?;

    step(
        4,
        "worker A resumes (SIGCONT) and finishes the write it had started, with its old token",
    );
    // The command is queued while A is stopped, as a write already under way would be.
    a.stdin.write_all(b"write-in-flight\n").await?;
    a.stdin.flush().await?;
    kill(Pid::from_raw(a.pid as i32), Signal::SIGCONT)?;
    procs.stopped.clear();
    let stale = a.answers(2).await?;
    tally.count("worker A", &stale);
    expect(&stale, 409, false)?;

    step(
        5,
        "a legacy job writes to the advisory service without a token",
    );
    let legacy_url = format!("{}/legacy/report-7", services["reports-legacy"]);
    let http = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::put(&legacy_url)
        .header("x-caller", "spiffe://acme/legacy-export")
        .body(Full::new(Bytes::from_static(b"total=12")))?;
    let resp = bounded(&format!("PUT {legacy_url}"), CALL_LIMIT, http.request(req)).await?;
    let status = resp.status().as_u16();
    let _ = bounded("its body", CALL_LIMIT, resp.into_body().collect()).await?;
    println!("      PUT {legacy_url} (no Fencing-Token) -> {status}");
    if status != 200 {
        return Err(format!("the advisory write got {status}").into());
    }
    let db = pg(&database).await?;
    let mut unprotected = Value::Null;
    for _ in 0..100 {
        let rows = bounded(
            "reading write_event",
            CALL_LIMIT,
            db.query(
                "SELECT service, outcome, resource, method, finding, enforcement, caller, namespace, class, token \
                 FROM write_event WHERE outcome = 'unprotected'",
                &[],
            ),
        )
        .await?;
        if let Some(r) = rows.first() {
            unprotected = json!({
                "count": rows.len(), "service": r.get::<_, String>(0), "outcome": r.get::<_, String>(1),
                "resource": r.get::<_, Option<String>>(2), "method": r.get::<_, Option<String>>(3),
                "finding": r.get::<_, Option<String>>(4), "enforcement": r.get::<_, Option<String>>(5),
                "caller": r.get::<_, Option<String>>(6), "namespace": r.get::<_, Option<String>>(7),
                "class": r.get::<_, Option<String>>(8), "token": r.get::<_, Option<i64>>(9),
            });
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if unprotected.is_null() {
        return Err("the unprotected write never reached the audit trail".into());
    }
    println!("      admitted, and recorded in the audit trail as unprotected: {unprotected}");

    step(6, "the etcd leader is killed; the workers go on");
    let leader = procs.etcd_leader().await?;
    let etcd = procs.etcd()?;
    let leader_pid = etcd.pid(leader).unwrap_or_default();
    etcd.kill(leader);
    println!("      killed etcd member m{leader} (pid {leader_pid}), the leader");
    let answers = b.send("write", 2).await?;
    tally.count("worker B", &answers);
    expect(&answers, 200, true)?;
    // The lock service needs etcd again from here: wait until the two members left have
    // elected a leader (about a second; several when the machine is busy and a vote is
    // split), rather than race the election with the service's request timeouts.
    procs.etcd_leader().await?;
    let released = b.send("release", 1).await?;
    println!("      worker B released token {}", released[0]["token"]);
    let token_a2 = a.send("acquire", 1).await?[0]["token"]
        .as_u64()
        .ok_or("A got no token")?;
    println!("      worker A, with a new session, acquires again: token {token_a2}");
    if token_a2 <= token_b {
        return Err(format!("tokens did not increase: {token_a2} <= {token_b}").into());
    }
    let answers = a.send("write", 2).await?;
    tally.count("worker A", &answers);
    expect(&answers, 200, true)?;
    let _ = a.send("release", 1).await?;

    let unprotected_count = unprotected["count"].as_u64().unwrap_or(0);
    println!("\n== summary ({:.1} s)", started.elapsed().as_secs_f64());
    println!("   writes admitted:    {}", tally.admitted);
    println!(
        "   writes rejected:    {} (stale token {token_a}: by the fence layer and by the database)",
        tally.rejected
    );
    println!(
        "   unprotected writes: {unprotected_count} (advisory service, no token; on the dashboard)"
    );
    println!("   tokens:             A {token_a} < B {token_b} < A again {token_a2}");
    println!(
        "   dashboard:          {dashboard} (overview)   refused writes: {dashboard}refused   \
         lock timeline: {dashboard}locks?key={LOCK}"
    );

    let outcome = json!({
        "tokens": [token_a, token_b, token_a2],
        "stale": stale,
        "unprotected": unprotected,
        "admitted": tally.admitted,
        "rejected": tally.rejected,
        "dashboard": dashboard,
    });
    if keep_running {
        println!("\neverything stays up: lock service {lock_url}, orders-api {orders}, dashboard {dashboard}");
        println!("logs in {}; Ctrl-C stops it all", dir.display());
    }
    Ok(outcome)
}

/// Why the scenario ended early.
enum Stop {
    /// A step failed or ran out of time.
    Failed(Error),
    /// A signal asked the demo to stop: its name and number.
    Signal((&'static str, i32)),
}

/// Resolves on Ctrl-C, SIGTERM or SIGHUP (a closed terminal), with the signal's name and
/// number: each ends the demo the same way, everything it started stopped, its database
/// dropped and its directory removed, and the exit code 128 plus the number.
async fn interrupted() -> (&'static str, i32) {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(mut term), Ok(mut hup)) => tokio::select! {
            _ = tokio::signal::ctrl_c() => ("SIGINT", 2),
            _ = term.recv() => ("SIGTERM", 15),
            _ = hup.recv() => ("SIGHUP", 1),
        },
        _ => {
            let _ = tokio::signal::ctrl_c().await;
            ("SIGINT", 2)
        }
    }
}

/// Checks a `write` answer pair: HTTP `status`, and the database write `committed` or not.
fn expect(answers: &[Value], status: u64, committed: bool) -> Result<(), Error> {
    let ok = answers
        .iter()
        .any(|a| a["via"] == "http" && a["status"] == status)
        && answers
            .iter()
            .any(|a| a["via"] == "postgres" && a["committed"] == committed);
    if ok {
        Ok(())
    } else {
        Err(
            format!("expected HTTP {status} and database committed={committed}, got {answers:?}")
                .into(),
        )
    }
}
