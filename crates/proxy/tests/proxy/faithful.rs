//! Faithful proxying: headers both ways, trailers, streamed bodies, upgrades, h2,
//! the upstream's failures and the client-side bounds.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_testkit::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{client, config, read, rows, send, start, Upstream, ORDERS};

#[tokio::test]
async fn headers_are_forwarded_and_hop_by_hop_fields_are_not() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    let req = Request::get(format!("http://{}/headers", proxy.addr))
        .header("host", "orders.example")
        .header("connection", "x-hop, fencing-token")
        .header("x-hop", "secret")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("x-forwarded-for", "10.1.2.3")
        .header("fencing-token", "77")
        .header("x-app", "kept")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = read(client().request(req).await.unwrap()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = r.json();
    assert_eq!(seen["host"], "orders.example");
    assert_eq!(seen["x-app"], "kept");
    assert_eq!(
        seen["fencing-token"], "77",
        "naming it in Connection does not strip it"
    );
    assert_eq!(seen["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "orders.example");
    assert_eq!(
        seen["forwarded"],
        "for=127.0.0.1;proto=http;host=\"orders.example\""
    );
    for hop in ["x-hop", "proxy-authorization"] {
        assert!(
            seen.get(hop).is_none(),
            "{hop} reached the upstream: {seen}"
        );
    }
    assert_eq!(
        r.headers["content-type"], "application/json",
        "response headers are kept"
    );
}

#[tokio::test]
async fn trailers_pass_to_a_client_that_asks_for_them() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    let req = Request::get(format!("http://{}/trailers", proxy.addr))
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client().request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers arrived");
    assert_eq!(trailers["x-checksum"], "abc123");
    assert_eq!(collected.to_bytes(), "hello trailers");
}

#[tokio::test]
async fn a_slow_body_streams_through_whole() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    tokio::spawn(async move {
        for i in 0..10u8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx
                .send(Ok(Frame::data(Bytes::from(vec![b'a' + i; 1000]))))
                .await;
        }
    });
    let body = StreamBody::new(tokio_stream_from(rx));
    let client = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::put(format!("http://{}/orders/slow", proxy.addr))
        .header("fencing-token", "1")
        .body(body)
        .unwrap();
    let r = read(client.request(req).await.unwrap()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let mut expect = Vec::new();
    for i in 0..10u8 {
        expect.extend(vec![b'a' + i; 1000]);
    }
    assert_eq!(r.json()["bytes"], 10_000);
    assert_eq!(r.json()["sha256"], sha256_hex(&expect));
    assert_eq!(rows(&db).await.len(), 1);
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn an_upstream_that_is_down_or_slow_gets_502_or_504_naming_it() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let slow = start(config(
        &format!("[timeouts]\nupstream_ms = 300\n{ORDERS}"),
        &up.url(),
    ))
    .await;
    let started = Instant::now();
    let r = send(slow.addr, Method::GET, "/slow?ms=3000", None, "").await;
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(started.elapsed() < Duration::from_millis(2500));
    assert_eq!(r.json()["type"], "urn:palisade:problem:upstream-timeout");
    assert_eq!(r.json()["upstream"], up.url());
    assert_eq!(slow.metrics.requests("default", "unchecked"), 1);

    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gone = format!("http://127.0.0.1:{free}");
    let down = start(config(ORDERS, &gone)).await;
    let r = send(down.addr, Method::PUT, "/orders/1", Some("5"), "x").await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert_eq!(
        r.json()["type"],
        "urn:palisade:problem:upstream-unavailable"
    );
    assert_eq!(r.json()["upstream"], gone);
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("cannot be reached"),
        "{}",
        r.body
    );
    // A client's mistake is still the client's: a stale token is 409 with the upstream down.
    let r = send(down.addr, Method::PUT, "/orders/1", Some("4"), "x").await;
    assert_eq!(r.status, 409, "{}", r.body);
}

/// Sends an HTTP/1.1 upgrade request for `path` on a fresh connection; the status line.
async fn upgrade(addr: std::net::SocketAddr, path: &str) -> (TcpStream, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "closed before the head: {}",
            String::from_utf8_lossy(&got)
        );
        got.push(byte[0]);
    }
    (tcp, String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test]
async fn a_websocket_passes_on_an_open_route_and_is_refused_on_a_fenced_one() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let text =
        format!("{ORDERS}\n[[route]]\npath = \"/ws\"\nmethods = [\"GET\"]\npolicy = \"fenced\"\n");
    let fenced = start(config(&text, &up.url())).await;
    let (_, head) = upgrade(fenced.addr, "/ws").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("application/problem+json"), "{head}");

    let open = start(config(ORDERS, &up.url())).await;
    // Only websocket: h2c would tunnel requests past every route.
    let mut h2c = TcpStream::connect(open.addr).await.unwrap();
    h2c.write_all(b"GET /headers HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
        .await
        .unwrap();
    let mut got = [0u8; 12];
    h2c.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"HTTP/1.1 403");
    let (mut tcp, head) = upgrade(open.addr, "/ws").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "the upstream's accept key: {head}"
    );
    for message in [&b"ping"[..], &b"a second message"[..]] {
        tcp.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, message);
    }
}

#[tokio::test]
async fn a_client_that_sends_its_head_slowly_is_cut_off_and_others_are_served() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(
        &format!("[timeouts]\nheader_ms = 500\n{ORDERS}"),
        &up.url(),
    ))
    .await;
    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"PUT /orders/1 HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let r = send(proxy.addr, Method::PUT, "/orders/2", Some("3"), "x").await;
    assert_eq!(r.status, 200, "served meanwhile: {}", r.body);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the slow connection was closed");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "the slow request was never forwarded: {}",
        String::from_utf8_lossy(&rest)
    );
    assert_eq!(rows(&db).await, vec![("2".into(), Some("3".into()))]);
}

#[tokio::test]
async fn h2_clients_get_the_same_verdicts() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let put = |token: &'static str| {
        Request::put(format!("http://{}/orders/9", proxy.addr))
            .header("fencing-token", token)
            .body(Full::new(Bytes::from_static(b"h2")))
            .unwrap()
    };
    let r = h2.request(put("20")).await.unwrap();
    assert_eq!(r.version(), http::Version::HTTP_2);
    let r = read(r).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["fencing_token"], "20");
    let r = read(h2.request(put("19")).await.unwrap()).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(rows(&db).await, vec![("9".into(), Some("20".into()))]);
}

#[tokio::test]
async fn a_body_that_stalls_is_the_clients_failure_not_the_upstreams() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    // The upstream's time does not run while the body arrives: a stall is the
    // client's (400), not the upstream's (504), though upstream_ms is shorter.
    let proxy = start(config(
        &format!("[timeouts]\nbody_stall_ms = 300\nupstream_ms = 100\n{ORDERS}"),
        &up.url(),
    ))
    .await;
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(b"PUT /orders/1 HTTP/1.1\r\nHost: x\r\nFencing-Token: 5\r\nContent-Length: 100\r\n\r\nonly ten b")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("urn:palisade:problem:body-failed"), "{text}");
    assert!(rows(&db).await.is_empty());
}

#[tokio::test]
async fn a_percent_before_a_multibyte_character_gets_an_answer() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all("PUT /%\u{20ac} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".as_bytes())
        .await
        .unwrap();
    let mut got = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut got))
        .await
        .unwrap()
        .expect("an answer, not a dropped connection");
    assert_eq!(&got, b"HTTP/1.1 ");
    // And the proxy still serves.
    assert_eq!(
        send(proxy.addr, Method::GET, "/headers", None, "")
            .await
            .status,
        200
    );
}
