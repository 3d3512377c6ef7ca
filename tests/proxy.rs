//! `palisade fence proxy` as a process: one command in front of a Python service,
//! SIGHUP reloads (a broken file changes nothing), SIGTERM drains, a config error at
//! start names its place, and a 1 GiB upload streams through in bounded memory.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_testkit::TestDb;

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.0.id() as i32), signal).unwrap();
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// The Python upstream of the proxy crate's tests, and its port.
fn upstream(db: &TestDb) -> (Proc, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/proxy/tests/proxy/upstream.py");
    let mut child = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(db.connection_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the Python upstream (/usr/bin/python3 with python3-psycopg; scripts/test installs it)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line from the upstream: {line}"));
    (Proc(child), port)
}

/// A running proxy, where it listens, and its stderr lines as they come.
struct Proxy {
    proc: Proc,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    log: mpsc::Receiver<String>,
}

fn proxy(args: &[&str]) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["fence", "proxy"])
        .args(args)
        .env_remove("PALISADE_FENCE_DATABASE")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, log) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let proc = Proc(child);
    let serving = wait_log(&log, "fencing proxy serving");
    let doc: serde_json::Value = serde_json::from_str(&serving).unwrap();
    let addr = doc["fields"]["listen"].as_str().unwrap().parse().unwrap();
    let admin = doc["fields"]["admin"].as_str().and_then(|a| a.parse().ok());
    Proxy {
        proc,
        addr,
        admin,
        log,
    }
}

/// The first stderr line containing `needle` within 20 s.
fn wait_log(log: &mpsc::Receiver<String>, needle: &str) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    panic!("no log line with {needle:?}; saw:\n{}", seen.join("\n"));
}

async fn put(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req = Request::put(format!("http://{addr}{path}"));
    if let Some(t) = token {
        req = req.header("fencing-token", t);
    }
    let req = req.body(Full::new(Bytes::from_static(b"x"))).unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let r = client.request(req).await.unwrap();
    let status = r.status().as_u16();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn get(url: String) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let r = client
        .request(Request::get(url).body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn proxy_flags_fence_a_python_service_in_one_command_and_sigterm_drains() {
    let db = TestDb::create().await;
    let (_up, port) = upstream(&db);
    let upstream_url = format!("http://127.0.0.1:{port}");
    let p = proxy(&[
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream_url,
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(
        get(format!("http://{}/livez", p.admin.unwrap())).await.0,
        200
    );
    assert_eq!(
        get(format!("http://{}/readyz", p.admin.unwrap())).await.0,
        200
    );
    assert_eq!(put(p.addr, "/orders/1", Some("10")).await.0, 200);
    let (status, body) = put(p.addr, "/orders/1", Some("9")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(put(p.addr, "/orders/2", None).await.0, 428);

    // A request in flight when SIGTERM comes is answered; then the process exits 0.
    let slow = tokio::spawn(get(format!("http://{}/slow?ms=1500", p.addr)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    p.proc.signal(Signal::SIGTERM);
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let Proxy {
        mut proc,
        log,
        addr,
        ..
    } = p;
    wait_log(&log, "SIGTERM: stopping");
    let status = tokio::task::spawn_blocking(move || {
        let s = proc.0.wait().unwrap();
        drop(proc);
        s
    })
    .await
    .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "nothing listens after the exit"
    );
    let rows: Vec<String> = db
        .connect()
        .await
        .query("SELECT fencing_token FROM orders_log ORDER BY n", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, vec!["10".to_owned()]);
}

const GOOD: &str = "[[route]]\npath = \"/orders/{id}\"\nresource = \"orders/{id}\"\npolicy = \"fenced\"\n\n[default]\npolicy = \"open\"\n";

#[tokio::test]
async fn proxy_sighup_reloads_and_a_broken_file_changes_nothing() {
    let db = TestDb::create().await;
    let (_up, port) = upstream(&db);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    let head = format!("listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:{port}\"\n");
    std::fs::write(&file, format!("{head}{GOOD}")).unwrap();
    let p = proxy(&["--config", file.to_str().unwrap()]);
    assert_eq!(put(p.addr, "/orders/1", None).await.0, 428);

    std::fs::write(
        &file,
        format!("{head}[[route]]\npath = \"/orders/{{id}}\"\npolicy = \"fencd\"\n"),
    )
    .unwrap();
    p.proc.signal(Signal::SIGHUP);
    let refused = wait_log(&p.log, "config not reloaded");
    assert!(
        refused.contains(":5: route[0].policy: `fencd` is not a policy"),
        "{refused}"
    );
    assert_eq!(
        put(p.addr, "/orders/1", None).await.0,
        428,
        "the old config serves"
    );

    std::fs::write(&file, format!("{head}[default]\npolicy = \"open\"\n")).unwrap();
    p.proc.signal(Signal::SIGHUP);
    wait_log(&p.log, "config reloaded");
    assert_eq!(
        put(p.addr, "/orders/1", None).await.0,
        200,
        "the new config serves"
    );
}

#[test]
fn proxy_a_bad_config_is_refused_at_start_naming_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\n\n[store]\nkind = \"zookeeper\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["fence", "proxy", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:5: store.kind: `zookeeper` is not a store",
            file.display()
        )),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "fence",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "ftp://x:1",
        ])
        .env_remove("PALISADE_FENCE_DATABASE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--upstream"));
}

/// The peak resident memory of process `pid` (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn proxy_streams_a_gibibyte_upload_in_bounded_memory() {
    const PIECE: usize = 1 << 20;
    const PIECES: usize = 1024;
    let db = TestDb::create().await;
    let (_up, port) = upstream(&db);
    let upstream_url = format!("http://127.0.0.1:{port}");
    let p = proxy(&["--listen", "127.0.0.1:0", "--upstream", &upstream_url]);
    let before = peak_kib(p.proc.pid());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
    let mut digest = <sha2::Sha256 as sha2::Digest>::new();
    let mut pieces = Vec::new();
    for i in 0..PIECES {
        let piece = Bytes::from(vec![(i % 16) as u8; PIECE]);
        sha2::Digest::update(&mut digest, &piece);
        if i < 16 {
            pieces.push(piece);
        }
    }
    let sha: String = sha2::Digest::finalize(digest)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    tokio::spawn(async move {
        for i in 0..PIECES {
            if tx
                .send(Ok(Frame::data(pieces[i % 16].clone())))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let mut rx = rx;
    let body = StreamBody::new(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let client = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::put(format!("http://{}/orders/big", p.addr))
        .header("fencing-token", "5")
        .header("content-length", (PIECE * PIECES).to_string())
        .body(body)
        .unwrap();
    let r = client.request(req).await.unwrap();
    assert_eq!(r.status(), 200);
    let mut text = String::new();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    body.as_ref().read_to_string(&mut text).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["bytes"], PIECE * PIECES);
    assert_eq!(doc["sha256"], sha);
    let peak = peak_kib(p.proc.pid());
    eprintln!("peak resident memory: {peak} KiB (before the upload: {before} KiB)");
    assert!(
        peak < 96 * 1024,
        "the proxy's peak resident memory was {peak} KiB (before the upload: {before} KiB)"
    );
}
