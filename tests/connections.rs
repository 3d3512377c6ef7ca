//! Connections that are held without being used: `palisade serve` (dev mode and mTLS)
//! and `palisade audit serve`, each a real process under an open-file limit of 1,024
//! (`prlimit`), against 2,000 idle connections and each kind of slow client. The process
//! stays up, the slow connections are closed within the bounds its flags set, normal
//! clients are served all along, and SIGTERM still stops it cleanly. (Tests that start
//! etcd have `etcd` in their names.)

mod common;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::service::wait_listening;
use palisade_lock::{FileEpochStore, LockClass, Locker, LockerOptions, Namespace};
use palisade_testkit::{EtcdCluster, TestDb};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The handshake, header and body stall bound every process here is started with.
const BOUND: Duration = Duration::from_secs(4);
/// How much later than its bound a slow connection may close on a busy machine.
const SLACK: Duration = Duration::from_secs(6);
/// The open-file limit of the process under test.
const NOFILE: u32 = 1024;
/// How many idle connections the test opens.
const IDLE: usize = 2000;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A `palisade` process under `prlimit --nofile`.
struct Proc {
    child: tokio::process::Child,
    target: Arc<Target>,
}

/// How to reach the process, and what it logged.
struct Target {
    stderr: Arc<Mutex<String>>,
    addr: SocketAddr,
    /// TLS to the service: as an anonymous client, and as one with an SVID.
    tls: Option<(TlsConnector, TlsConnector)>,
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The bounds as flags, and the cap.
fn limit_flags(max_connections: Option<u32>) -> Vec<OsString> {
    let ms = BOUND.as_millis().to_string();
    let mut flags: Vec<OsString> = [
        "--handshake-timeout-ms",
        &ms,
        "--header-timeout-ms",
        &ms,
        "--body-stall-timeout-ms",
        &ms,
    ]
    .iter()
    .map(Into::into)
    .collect();
    if let Some(max) = max_connections {
        flags.push("--max-connections".into());
        flags.push(max.to_string().into());
    }
    flags
}

impl Proc {
    /// Starts `palisade ARGS` listening on `addr`, with `tls` as the way to reach it.
    async fn spawn(
        args: Vec<OsString>,
        addr: SocketAddr,
        tls: Option<(TlsConnector, TlsConnector)>,
    ) -> Proc {
        let mut child = tokio::process::Command::new("prlimit")
            .arg(format!("--nofile={NOFILE}:{NOFILE}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_palisade"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("prlimit (util-linux) runs palisade");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        wait_listening(addr).await;
        Proc {
            child,
            target: Arc::new(Target { stderr, addr, tls }),
        }
    }

    /// Still running (not exited).
    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the process exited:\n{}",
            self.target.stderr()
        );
    }

    /// SIGTERM: exits 0 within 15 s.
    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("stops within 15 s of SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}:\n{}", self.target.stderr());
    }
}

impl Target {
    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// A connection: TCP, and on an mTLS service the handshake, anonymous or with the
    /// test's SVID.
    async fn connect(&self, with_svid: bool) -> Box<dyn Stream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        match &self.tls {
            None => Box::new(tcp),
            Some((anonymous, svid)) => {
                let c = if with_svid { svid } else { anonymous };
                Box::new(
                    c.connect(ServerName::try_from("localhost").unwrap(), tcp)
                        .await
                        .unwrap(),
                )
            }
        }
    }

    /// A normal client: a new connection, one request, its status and body; within 20 s.
    async fn call(&self, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
        tokio::time::timeout(Duration::from_secs(20), async {
            let mut s = self.connect(true).await;
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: {}\r\n{headers}content-length: {}\r\n\r\n{body}",
                self.addr,
                body.len()
            );
            s.write_all(request.as_bytes()).await.unwrap();
            read_response(&mut s).await
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{method} {path} not answered within 20 s:\n{}",
                self.stderr()
            )
        })
    }
}

/// Reads one response with a content-length body: status and body.
async fn read_response(s: &mut (impl AsyncRead + Unpin)) -> (u16, String) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "closed before a response: {buf:?}");
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    s.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8(body).unwrap())
}

/// Waits until the peer closes `s`, reading and dropping what it sends first; panics if
/// it is still open `BOUND + SLACK` after `since`.
async fn closed_by(s: &mut (impl AsyncRead + Unpin), since: Instant, kind: &str) {
    let mut buf = [0u8; 1024];
    loop {
        let left = (since + BOUND + SLACK).saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => panic!("{kind}: still open {:?} after it started", since.elapsed()),
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

/// Every kind of slow client against `proc`, each checking it is closed in time.
fn slow_clients(proc: &Arc<Target>, post_path: &'static str) -> Vec<tokio::task::JoinHandle<()>> {
    let mut all = Vec::new();
    let addr = proc.addr;
    all.push(tokio::spawn(async move {
        let started = Instant::now();
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        closed_by(&mut tcp, started, "TCP only").await;
    }));
    let p = Arc::clone(proc);
    all.push(tokio::spawn(async move {
        let mut conn = p.connect(false).await;
        let started = Instant::now();
        conn.write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n")
            .await
            .unwrap();
        let (mut read, mut write) = tokio::io::split(conn);
        let trickle = tokio::spawn(async move {
            while write.write_all(b"x").await.is_ok() && write.flush().await.is_ok() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        closed_by(&mut read, started, "header trickle").await;
        trickle.abort();
    }));
    let p = Arc::clone(proc);
    all.push(tokio::spawn(async move {
        let mut conn = p.connect(false).await;
        conn.write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        read_response(&mut conn).await;
        let started = Instant::now();
        closed_by(&mut conn, started, "idle keep-alive after one request").await;
    }));
    let p = Arc::clone(proc);
    all.push(tokio::spawn(async move {
        let mut conn = p.connect(true).await;
        let head = format!(
            "POST {post_path} HTTP/1.1\r\nHost: localhost\r\nx-palisade-dev-identity: {}\r\n\
             content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"ttl",
            common::service::JOB
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let started = Instant::now();
        closed_by(&mut conn, started, "stalled body").await;
    }));
    if proc.tls.is_some() {
        all.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
            closed_by(&mut tcp, started, "partial ClientHello").await;
        }));
        let p = Arc::clone(proc);
        all.push(tokio::spawn(async move {
            let mut conn = p.connect(false).await;
            let started = Instant::now();
            closed_by(&mut conn, started, "TLS handshake then silence").await;
        }));
    }
    all
}

/// Opens `IDLE` connections and holds them; returns those that connected.
async fn idle_flood(addr: SocketAddr) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(IDLE);
    for _ in 0..IDLE / 100 {
        let batch = (0..100)
            .map(|_| tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)));
        for c in futures_join_all(batch).await {
            if let Ok(Ok(c)) = c {
                held.push(c);
            }
        }
    }
    held
}

/// Runs `futures` concurrently and collects their outputs in order.
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// What every service check does: slow clients and the idle flood at once, normal
/// clients served throughout, the process up, the slow ones closed in time.
async fn held_connections_do_not_stop_it(
    mut proc: Proc,
    normal: &[(&str, &str, &str, &str, u16)],
    post_path: &'static str,
    expect_limit_line: bool,
) {
    // The test process holds IDLE sockets: raise its own soft limit to its hard limit
    // (only ever up; nextest runs each test in a process of its own).
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < 4 * IDLE as u64 {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    let target = Arc::clone(&proc.target);
    let slow = slow_clients(&target, post_path);
    let started = Instant::now();
    let held = idle_flood(target.addr).await;
    assert!(
        held.len() > NOFILE as usize,
        "only {} of {IDLE} connections opened",
        held.len()
    );
    // Normal clients, one after another, while the slow and idle ones are held.
    while started.elapsed() < BOUND + SLACK / 2 {
        for (method, path, headers, body, status) in normal {
            let (got, text) = target.call(method, path, headers, body).await;
            assert_eq!(got, *status, "{method} {path}: {text}\n{}", target.stderr());
        }
        proc.assert_running();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for s in slow {
        s.await.unwrap();
    }
    proc.assert_running();
    let stderr = target.stderr();
    if expect_limit_line {
        assert!(
            stderr.contains(&format!("open-file limit (RLIMIT_NOFILE) is {NOFILE}")),
            "no log line names the limit:\n{stderr}"
        );
    }
    assert!(!stderr.contains("serving failed"), "{stderr}");
    drop(held);
    proc.stop().await;
}

/// etcd with namespace `ns`, class `c`, and an authorization config granting JOB.
async fn etcd_and_config(dir: &Path) -> (EtcdCluster, Vec<OsString>) {
    let cluster = EtcdCluster::start(1).await;
    let epoch_file = dir.join("epoch.json");
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
    let config = dir.join("authz.toml");
    std::fs::write(
        &config,
        "admins = []\n[[namespace]]\nid = \"ns\"\n[[namespace.grant]]\nids = [\"spiffe://test/jobs/\"]\nclasses = [\"c\"]\n",
    )
    .unwrap();
    let args = vec![
        "serve".into(),
        "--etcd".into(),
        cluster.endpoints().join(",").into(),
        "--config".into(),
        config.into(),
        "--epoch-file".into(),
        epoch_file.into(),
    ];
    (cluster, args)
}

/// The normal clients of the lock service: the probes and a session opened.
fn service_calls(dev: bool) -> Vec<(&'static str, &'static str, &'static str, &'static str, u16)> {
    let id = if dev {
        "x-palisade-dev-identity: spiffe://test/jobs/a\r\ncontent-type: application/json\r\n"
    } else {
        "content-type: application/json\r\n"
    };
    vec![
        ("GET", "/livez", "", "", 200),
        ("GET", "/readyz", "", "", 200),
        ("POST", "/v1/sessions", id, "{\"ttl_ms\": 5000}", 201),
    ]
}

/// Dev mode with a cap above the open-file limit: accepting runs out of descriptors,
/// which is logged with the limit and survived.
#[tokio::test]
async fn etcd_dev_service_survives_descriptor_exhaustion_and_slow_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, mut args) = etcd_and_config(dir.path()).await;
    let addr = free_addr();
    args.extend(["--listen".into(), addr.to_string().into()]);
    args.push("--insecure-dev-identity".into());
    args.extend(limit_flags(Some(4000)));
    let proc = Proc::spawn(args, addr, None).await;
    held_connections_do_not_stop_it(proc, &service_calls(true), "/v1/sessions", true).await;
}

/// mTLS with the default cap (512): idle connections make room for new ones.
#[tokio::test]
async fn etcd_mtls_service_survives_idle_connections_and_slow_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, mut args) = etcd_and_config(dir.path()).await;
    let addr = free_addr();
    let pki = Pki::new("test CA");
    let server = pki.server().files(dir.path(), "server");
    args.extend(["--listen".into(), addr.to_string().into()]);
    args.extend(["--tls-cert".into(), server.cert.into_os_string()]);
    args.extend(["--tls-key".into(), server.key.into_os_string()]);
    args.extend([
        "--client-ca".into(),
        pki.ca_file(dir.path()).into_os_string(),
    ]);
    args.extend(limit_flags(None));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let svid = pki.client(&[common::service::JOB]);
    let chain = CertificateDer::pem_slice_iter(svid.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(svid.key_pem.as_bytes()).unwrap();
    let tls = Some((
        TlsConnector::from(Arc::new(builder.clone().with_no_client_auth())),
        TlsConnector::from(Arc::new(builder.with_client_auth_cert(chain, key).unwrap())),
    ));
    let proc = Proc::spawn(args, addr, tls).await;
    held_connections_do_not_stop_it(proc, &service_calls(false), "/v1/sessions", false).await;
}

/// The audit dashboard with a cap above the open-file limit.
#[tokio::test]
async fn dashboard_survives_descriptor_exhaustion_and_slow_clients() {
    let db = TestDb::create().await;
    let addr = free_addr();
    let mut args: Vec<OsString> = vec![
        "audit".into(),
        "serve".into(),
        "--database".into(),
        db.connection_string().into(),
        "--listen".into(),
        addr.to_string().into(),
    ];
    args.extend(limit_flags(Some(4000)));
    let proc = Proc::spawn(args, addr, None).await;
    let calls = [
        ("GET", "/api/force-releases", "", "", 200),
        ("GET", "/metrics", "", "", 200),
    ];
    held_connections_do_not_stop_it(proc, &calls, "/api/overview", true).await;
}
