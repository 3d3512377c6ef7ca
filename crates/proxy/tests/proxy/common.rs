//! The Python upstream, a proxy in this process, and an HTTP client.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_proxy::{Proxy, ProxyConfig, ProxyMetrics, Reloader};
use palisade_testkit::TestDb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// The Python upstream: `upstream.py` on a free loopback port, killed on drop.
pub(crate) struct Upstream {
    _child: Child,
    pub(crate) port: u16,
}

impl Upstream {
    pub(crate) async fn start(db: &TestDb) -> Upstream {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy/upstream.py");
        // Debian's python3, where python3-psycopg is installed (scripts/test).
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(db.connection_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting the Python upstream (/usr/bin/python3; scripts/test installs python3-psycopg)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the upstream says where it listens")
            .unwrap()
            .expect("the upstream printed a line");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from the upstream: {first}"));
        Upstream {
            _child: child,
            port,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A proxy serving in this process until dropped.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) admin: Option<SocketAddr>,
    pub(crate) metrics: ProxyMetrics,
    pub(crate) reloader: Reloader,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<bool>>,
}

impl Running {
    /// Stops it and waits for the drain; whether every request finished.
    pub(crate) async fn stop(mut self) -> bool {
        let _ = self.stop.take().unwrap().send(());
        self.done.take().unwrap().await.unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `text` with `{upstream}` replaced, on 127.0.0.1:0, as a config.
pub(crate) fn config(text: &str, upstream: &str) -> ProxyConfig {
    let text = format!("listen = \"127.0.0.1:0\"\nupstream = \"{upstream}\"\n{text}");
    ProxyConfig::parse("test.toml", &text).unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) async fn start(config: ProxyConfig) -> Running {
    let proxy = Proxy::bind(config).await.unwrap();
    let (addr, admin) = (proxy.local_addr(), proxy.admin_addr());
    let metrics = proxy.metrics().clone();
    let reloader = proxy.reloader();
    let (stop, stopped) = oneshot::channel();
    let done = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        admin,
        metrics,
        reloader,
        stop: Some(stop),
        done: Some(done),
    }
}

/// An HTTP/1.1 client.
pub(crate) fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response's status, headers and body text.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

pub(crate) async fn read(response: Response<hyper::body::Incoming>) -> Reply {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `method path` on `addr` with `token` (if any) and `body`.
pub(crate) async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: &'static str,
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if let Some(t) = token {
        req = req.header("fencing-token", t);
    }
    let req = req
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    read(client().request(req).await.unwrap()).await
}

/// The rows the upstream wrote: (id, fencing_token), in order.
pub(crate) async fn rows(db: &TestDb) -> Vec<(String, Option<String>)> {
    db.connect()
        .await
        .query("SELECT id, fencing_token FROM orders_log ORDER BY n", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// GET `path` on the admin listener: (status, body).
pub(crate) async fn admin(addr: SocketAddr, path: &str) -> (u16, String) {
    let req = Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = read(client().request(req).await.unwrap()).await;
    (r.status, r.body)
}

pub(crate) const ORDERS: &str = r#"
[default]
policy = "open"

[[route]]
path = "/orders/{id}"
resource = "orders/{id}"
policy = "fenced"

[[route]]
path = "/legacy/{id}"
methods = ["PUT"]
policy = "advisory"
"#;
