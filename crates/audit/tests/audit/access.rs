//! The dashboard's Host allow-list and bearer token, over real HTTP on loopback: a
//! request naming another host is refused (DNS rebinding), an allowed host is served,
//! and a configured token is required.

use std::net::SocketAddr;

use palisade_audit::dashboard::Access;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::migrated_db;

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTP/1.1 GET with exactly the `Host` (and extra header lines) given.
async fn get(addr: SocketAddr, path: &str, host: &str, extra: &str) -> Answer {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// The dashboard behind `access(addr)` on a free loopback port.
async fn serve(
    pool: deadpool_postgres::Pool,
    access: impl FnOnce(SocketAddr) -> Access,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = access(addr).protect(palisade_audit::dashboard::router(pool));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn assert_problem(a: &Answer, status: u16, slug: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let body = a.json();
    assert_eq!(
        body["type"],
        format!("urn:palisade:problem:{slug}"),
        "{body}"
    );
    assert_eq!(body["title"], slug);
    assert_eq!(body["status"], status);
}

#[tokio::test]
async fn the_dashboard_answers_only_its_hosts() {
    let (_db, pool) = migrated_db().await;
    let addr = serve(pool, |addr| {
        Access::for_listen_addr(addr)
            .with_host("audit.example")
            .unwrap()
    })
    .await;
    let port = addr.port();
    // DNS rebinding: evil.example resolves to the dashboard's address, the browser
    // sends evil.example as the host.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1.evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
    ] {
        let refused = get(addr, "/api/force-releases", &host, "").await;
        assert_problem(&refused, 403, "forbidden");
        let detail = refused.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(&format!("{host:?}")), "{detail}");
        assert!(detail.contains("localhost"), "{detail}");
        assert!(!refused.body.contains("\"forces\""), "{}", refused.body);
    }
    // Every route is behind it, pages included.
    assert_problem(&get(addr, "/", "evil.example", "").await, 403, "forbidden");
    // The listen address, the loopback names (any case, a trailing dot) and the added
    // name are served.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("LocalHost.:{port}"),
        format!("[::1]:{port}"),
        "audit.example".to_owned(),
    ] {
        let served = get(addr, "/api/force-releases", &host, "").await;
        assert_eq!(served.status, 200, "{host}: {}", served.body);
        assert!(
            served.json().is_object() || served.json().is_array(),
            "{}",
            served.body
        );
    }
}

#[tokio::test]
async fn the_dashboard_with_a_token_needs_it_on_every_request() {
    let (_db, pool) = migrated_db().await;
    let addr = serve(pool, |addr| {
        Access::for_listen_addr(addr)
            .with_bearer_token("s3cr3t-t0ken\n")
            .unwrap()
    })
    .await;
    let host = format!("127.0.0.1:{}", addr.port());
    for extra in [
        "",
        "Authorization: Bearer wrong\r\n",
        "Authorization: Basic czNjcjN0LXQwa2Vu\r\n",
        "Authorization: Bearer s3cr3t-t0ke\r\n",
    ] {
        let refused = get(addr, "/api/force-releases", &host, extra).await;
        assert_problem(&refused, 401, "unauthenticated");
        assert_eq!(
            refused.header("www-authenticate"),
            Some("Bearer"),
            "{extra}"
        );
    }
    let served = get(
        addr,
        "/api/force-releases",
        &host,
        "Authorization: Bearer s3cr3t-t0ken\r\n",
    )
    .await;
    assert_eq!(served.status, 200, "{}", served.body);
    let metrics = get(
        addr,
        "/metrics",
        &host,
        "Authorization: bearer s3cr3t-t0ken\r\n",
    )
    .await;
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    assert!(
        metrics.body.contains("palisade_audit_gaps"),
        "{}",
        metrics.body
    );
    // The token does not make another host acceptable.
    let refused = get(
        addr,
        "/api/force-releases",
        "evil.example",
        "Authorization: Bearer s3cr3t-t0ken\r\n",
    )
    .await;
    assert_problem(&refused, 403, "forbidden");
}
