//! The fencing proxy against nginx: the same fast upstream (a minimal axum service on
//! its own one-thread runtime) reached directly, through nginx (`proxy_pass`, keep-alive
//! to the upstream, one worker process), and through `palisade fence proxy` (one
//! runtime thread) with a MemoryStore and with a PostgresStore, each on a fenced route.
//! N keep-alive HTTP/1.1 connections from this process write `PUT /r/<resource>` with
//! the current token, as in the fence-layer bench: after a resource's first write, the
//! check finds the token equal to the mark.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::routing::put;
use axum::Router;
use palisade_fence::{migrate, FencingToken};
use palisade_proxy::{Proxy, ProxyConfig};
use palisade_testkit::TestDb;

use crate::drive::{interleave, Op};
use crate::error::{BenchError, Result};
use crate::http::connection;
use crate::report::{f, ratio, Table};

const VARIANTS: [&str; 4] = [
    "upstream, direct",
    "nginx proxy_pass",
    "palisade fence proxy + MemoryStore",
    "palisade fence proxy + PostgresStore",
];
const NGINX: usize = 1;
const TARGETS: [&str; 4] = ["", "", ">= 1.0x (p99 <= 1.2x)", ">= 0.6x"];

/// nginx, stopped with the bench: SIGTERM to the master, which ends its worker (a
/// SIGKILL would leave the worker running).
struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// nginx with one worker in front of `upstream`, on a free port.
async fn nginx(
    dir: &Path,
    upstream: SocketAddr,
    connections: usize,
) -> Result<(Nginx, SocketAddr)> {
    let port = free_port()?;
    let conf = format!(
        "worker_processes 1;\nerror_log {dir}/error.log;\npid {dir}/nginx.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n  upstream up {{ server {upstream}; keepalive {connections}; keepalive_requests 1000000; }}\n  server {{\n    listen 127.0.0.1:{port};\n    keepalive_requests 1000000;\n    location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n  }}\n}}\n",
        dir = dir.display(),
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    // Debian's nginx is in /usr/sbin, which not every PATH has.
    let exe = if Path::new("/usr/sbin/nginx").exists() {
        "/usr/sbin/nginx"
    } else {
        "nginx"
    };
    let child = Command::new(exe)
        .args(["-p"])
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|_| {
            BenchError::Unexpected(
                "nginx did not start: install Debian's nginx (see BENCHMARKS.md)",
            )
        })?;
    let nginx = Nginx(child);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok((nginx, addr));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(BenchError::Unexpected("nginx did not listen within 5 s"))
}

/// A runtime shut down in the background when dropped, also on an early return (a
/// runtime dropped inside another's async context panics).
struct Background(Option<tokio::runtime::Runtime>);

impl Background {
    /// One worker thread named `name` (profilers tell the runtimes apart by it).
    fn one_thread(name: &str) -> Result<Background> {
        Ok(Background(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .enable_all()
                .build()?,
        )))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("a runtime until dropped").handle()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Starts everything, runs the comparison, returns its table.
pub(crate) async fn run(
    connections: usize,
    resources: usize,
    secs: Duration,
    rounds: usize,
) -> Result<Table> {
    let db = TestDb::create().await;
    let mut setup = db.connect().await;
    migrate(&mut setup).await?;
    let dir = tempfile::tempdir()?;

    let upstream_rt = Background::one_thread("bench-upstream")?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let upstream = listener.local_addr()?;
    upstream_rt.handle().spawn(async move {
        let app = Router::new().route("/r/{id}", put(|| async { "ok" }));
        if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
            let _ = axum::serve(listener, app).await;
        }
    });
    let (_nginx, nginx_addr) = nginx(dir.path(), upstream, connections).await?;

    let proxy_rt = Background::one_thread("bench-proxy")?;
    let route =
        "[default]\npolicy = \"open\"\n[[route]]\npath = \"/r/{id}\"\npolicy = \"fenced\"\n";
    let memory = format!("listen = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\n{route}");
    let postgres = format!(
        "{memory}[store]\nkind = \"postgres\"\ndatabase = \"{}\"\n",
        db.connection_string()
    );
    let mut proxies = Vec::new();
    for text in [memory, postgres] {
        let config = ProxyConfig::parse("bench", &text)
            .map_err(|_| BenchError::Unexpected("the bench's proxy config did not parse"))?;
        let proxy = proxy_rt
            .handle()
            .spawn(Proxy::bind(config))
            .await
            .map_err(|_| BenchError::Unexpected("binding the proxy panicked"))?
            .map_err(|_| BenchError::Unexpected("the proxy did not bind"))?;
        proxies.push(proxy.local_addr());
        proxy_rt.handle().spawn(proxy.run(std::future::pending()));
    }

    let token = FencingToken::from_u64(1 << 48)
        .unwrap_or(FencingToken::MIN)
        .to_string();
    let mut variants: Vec<Vec<Op>> = Vec::new();
    for addr in [upstream, nginx_addr, proxies[0], proxies[1]] {
        let mut ops = Vec::with_capacity(connections);
        for i in 0..connections {
            let paths: Vec<String> = (0..resources.max(1))
                .map(|k| format!("/r/c{i}-{k}"))
                .collect();
            ops.push(connection(addr, paths, token.clone()).await?);
        }
        variants.push(ops);
    }
    eprintln!("fence-proxy: {connections} connections");
    let run = interleave(variants, rounds, secs).await?;
    let mut table = Table::new(
        format!(
            "Fencing proxy vs nginx: {connections} keep-alive connections on loopback, each proxy on one thread (nginx: one worker), the same axum upstream on one thread ({} s x {rounds} rounds per variant; ratio = median of per-round ratios)",
            secs.as_secs_f64()
        ),
        &["variant", "req/s", "p50 ms", "p99 ms", "vs nginx", "p99 vs nginx", "target"],
    );
    let nginx_p99 = run.merged[NGINX].ms(0.99);
    for (v, s) in run.merged.iter().enumerate() {
        table.row(vec![
            VARIANTS[v].to_owned(),
            f(s.rate(), 0),
            f(s.ms(0.5), 2),
            f(s.ms(0.99), 2),
            ratio(run.ratio(v, NGINX)),
            ratio(s.ms(0.99) / nginx_p99.max(f64::MIN_POSITIVE)),
            TARGETS[v].to_owned(),
        ]);
    }
    Ok(table)
}
