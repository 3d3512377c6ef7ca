//! `palisade_listen::serve` over real sockets on loopback, plain and TLS: each kind of
//! slow client is closed within its bound while a normal client is served, the cap makes
//! room by closing idle connections, the probe reserve answers when every connection is
//! busy, and shutdown answers what is in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use palisade_listen::{serve, ConnLimits, Transport};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Mutex, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

/// The bound every timeout gets in these tests.
const BOUND: Duration = Duration::from_millis(600);
/// How much later than its bound a connection may close on a busy machine.
const SLACK: Duration = Duration::from_secs(4);
/// The size of `/big`: far more than loopback's socket buffers hold.
const BIG: usize = 64 << 20;

/// What the `/hold` route shares with the test: it reports each request that entered
/// and answers once the test adds a permit.
struct Hold {
    entered: mpsc::UnboundedSender<()>,
    release: Semaphore,
}

fn app(hold: Arc<Hold>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/hello", get(|| async { "hello" }))
        .route("/echo", post(|body: bytes::Bytes| async move { body }))
        .route("/big", get(|| async { vec![b'x'; BIG] }))
        .route(
            "/hold",
            get(move || {
                let hold = Arc::clone(&hold);
                async move {
                    let _ = hold.entered.send(());
                    hold.release.acquire().await.unwrap().forget();
                    "held"
                }
            }),
        )
}

struct Server {
    addr: SocketAddr,
    entered: Mutex<mpsc::UnboundedReceiver<()>>,
    hold: Arc<Hold>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    tls: Option<TlsConnector>,
}

fn limits() -> ConnLimits {
    ConnLimits::new()
        .with_handshake_timeout(BOUND)
        .with_header_timeout(BOUND)
        .with_body_stall_timeout(BOUND)
}

/// A self-signed certificate for `localhost`: the server's config, and a client that
/// trusts it.
fn tls_pair() -> (Arc<rustls::ServerConfig>, TlsConnector) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let der: CertificateDer<'static> = cert.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), TlsConnector::from(Arc::new(client)))
}

async fn start(tls: bool, limits: ConnLimits) -> Server {
    let (entered, entered_rx) = mpsc::unbounded_channel();
    let hold = Arc::new(Hold {
        entered,
        release: Semaphore::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (transport, connector) = if tls {
        let (server, client) = tls_pair();
        (Transport::Tls(server), Some(client))
    } else {
        (Transport::Plain, None)
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let router = app(Arc::clone(&hold));
    let task = tokio::spawn(serve(
        listener,
        transport,
        limits,
        move |_: &palisade_listen::Peer| router.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    Server {
        addr,
        entered: Mutex::new(entered_rx),
        hold,
        stop: Some(stop),
        task,
        tls: connector,
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl Server {
    /// A TCP connection, and the TLS handshake over it on a TLS server.
    async fn connect(&self) -> Box<dyn Stream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        match &self.tls {
            None => Box::new(tcp),
            Some(c) => Box::new(
                c.connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
                    .unwrap(),
            ),
        }
    }

    /// A normal client: a new connection, one request, its answer.
    async fn get(&self, path: &str) -> (u16, String, String) {
        let mut s = self.connect().await;
        request(&mut s, path).await
    }

    /// Waits until `n` more requests entered `/hold`.
    async fn entered(&self, n: usize) {
        let mut rx = self.entered.lock().await;
        for _ in 0..n {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a /hold request entered")
                .unwrap();
        }
    }
}

/// One GET on `s` (kept alive): status, head and body.
async fn request(
    s: &mut (impl AsyncRead + AsyncWrite + Unpin),
    path: &str,
) -> (u16, String, String) {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_response(s).await
}

/// Reads one response with a content-length body.
async fn read_response(s: &mut (impl AsyncRead + Unpin)) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert_eq!(n, 1, "the connection closed before a response: {buf:?}");
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
    (status, head, String::from_utf8(body).unwrap())
}

/// How long after `since` the peer closed `s` (EOF or reset), reading and dropping
/// anything it sends first; panics past `BOUND + SLACK` after `since`.
async fn closed_after(s: &mut (impl AsyncRead + Unpin), since: Instant) -> Duration {
    let mut buf = [0u8; 1024];
    let deadline = since + BOUND + SLACK;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => panic!("still open {:?} after it started", since.elapsed()),
            Ok(Ok(0)) | Ok(Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

/// One slow client: what it does, and when it must be closed.
type Slow = JoinHandle<(&'static str, Duration)>;

/// Starts every kind of slow client against `server`.
fn slow_clients(server: &Arc<Server>) -> Vec<Slow> {
    let mut all: Vec<Slow> = Vec::new();
    let addr = server.addr;
    let tls = server.tls.is_some();
    // TCP only: no byte, no handshake.
    all.push(tokio::spawn(async move {
        let started = Instant::now();
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        ("TCP only", closed_after(&mut tcp, started).await)
    }));
    // Half a request head, then a byte every 100 ms: bounded as a whole, not per byte.
    let s = Arc::clone(server);
    all.push(tokio::spawn(async move {
        let started = Instant::now();
        let mut conn = s.connect().await;
        conn.write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n")
            .await
            .unwrap();
        let (mut read, mut write) = tokio::io::split(conn);
        let trickle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if write.write_all(b"x").await.is_err() || write.flush().await.is_err() {
                    break;
                }
            }
        });
        let took = closed_after(&mut read, started).await;
        trickle.abort();
        ("header trickle", took)
    }));
    // One request answered, then nothing: the idle keep-alive bound.
    let s = Arc::clone(server);
    all.push(tokio::spawn(async move {
        let mut conn = s.connect().await;
        // Before the request: the bound runs from the response, which is later.
        let started = Instant::now();
        let (status, _, body) = request(&mut conn, "/hello").await;
        assert_eq!((status, body.as_str()), (200, "hello"));
        (
            "idle keep-alive after one request",
            closed_after(&mut conn, started).await,
        )
    }));
    // A body that stops: the handler's read of it fails after the stall bound, the
    // answer is a 4xx, and the connection closes.
    let s = Arc::clone(server);
    all.push(tokio::spawn(async move {
        let mut conn = s.connect().await;
        let started = Instant::now();
        conn.write_all(b"POST /echo HTTP/1.1\r\nHost: localhost\r\ncontent-length: 10\r\n\r\nabc")
            .await
            .unwrap();
        let (status, _, _) = read_response(&mut conn).await;
        assert!((400..500).contains(&status), "a stalled body got {status}");
        ("stalled body", closed_after(&mut conn, started).await)
    }));
    // A body that trickles with pauses longer than the bound.
    let s = Arc::clone(server);
    all.push(tokio::spawn(async move {
        let mut conn = s.connect().await;
        let started = Instant::now();
        conn.write_all(b"POST /echo HTTP/1.1\r\nHost: localhost\r\ncontent-length: 10\r\n\r\n")
            .await
            .unwrap();
        let (mut read, mut write) = tokio::io::split(conn);
        let trickle = tokio::spawn(async move {
            loop {
                if write.write_all(b"y").await.is_err() {
                    break;
                }
                tokio::time::sleep(BOUND * 2).await;
            }
        });
        let took = closed_after(&mut read, started).await;
        trickle.abort();
        ("body trickle", took)
    }));
    if tls {
        // Half a ClientHello record header, then nothing.
        all.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
            ("partial ClientHello", closed_after(&mut tcp, started).await)
        }));
        // The handshake, then not a byte of HTTP.
        let s = Arc::clone(server);
        all.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut conn = s.connect().await;
            (
                "TLS handshake then silence",
                closed_after(&mut conn, started).await,
            )
        }));
    }
    all
}

/// Every slow client is closed no sooner than the bound and within `BOUND + SLACK`,
/// while normal clients are served all along.
async fn slow_clients_are_closed_and_others_served(tls: bool) {
    let server = Arc::new(start(tls, limits()).await);
    let slow = slow_clients(&server);
    let kinds = slow.len();
    // A normal client every 100 ms while the slow ones are open.
    let mut served = 0;
    let started = Instant::now();
    while started.elapsed() < BOUND * 2 {
        assert_eq!(server.get("/hello").await.2, "hello");
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in slow {
        let (kind, took) = s.await.unwrap();
        assert!(
            took >= BOUND - Duration::from_millis(50),
            "{kind}: closed after {took:?}, before its bound"
        );
    }
    assert!(served >= 5, "served {served}");
    assert!(kinds >= 5);
    // Still serving.
    assert_eq!(server.get("/hello").await.2, "hello");
}

#[tokio::test]
async fn plain_slow_clients_are_closed_within_their_bounds() {
    slow_clients_are_closed_and_others_served(false).await;
}

#[tokio::test]
async fn tls_slow_clients_are_closed_within_their_bounds() {
    slow_clients_are_closed_and_others_served(true).await;
}

/// A client that asks for a large response and reads none of it is closed after the
/// stall bound: what it reads afterwards ends well before the whole response.
#[tokio::test]
async fn a_client_that_stops_reading_is_closed() {
    for tls in [false, true] {
        let server = start(tls, limits()).await;
        let mut conn = server.connect().await;
        conn.write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(BOUND * 3).await;
        let mut got = 0;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match tokio::time::timeout(SLACK, conn.read(&mut buf)).await {
                Err(_) => panic!("tls {tls}: still open after {got} bytes"),
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got += n,
            }
        }
        assert!(got < BIG / 2, "tls {tls}: read {got} of {BIG} bytes");
        assert_eq!(server.get("/hello").await.2, "hello");
    }
}

/// At the cap, a new connection closes the oldest idle one; the others stay usable.
#[tokio::test]
async fn at_the_cap_a_new_connection_replaces_the_oldest_idle_one() {
    let long = Duration::from_secs(60);
    let server = start(
        false,
        limits()
            .with_header_timeout(long)
            .with_max_connections(3)
            .with_probe_reserve(0),
    )
    .await;
    let mut oldest = TcpStream::connect(server.addr).await.unwrap();
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    let _third = TcpStream::connect(server.addr).await.unwrap();
    let started = Instant::now();
    assert_eq!(server.get("/hello").await.2, "hello");
    closed_after(&mut oldest, started).await;
    // The second one was not closed: it is served.
    assert_eq!(request(&mut second, "/hello").await.2, "hello");
}

/// With a request in flight on every connection, the reserve answers the probe paths
/// and 503 to anything else; once the requests end, clients are served again.
#[tokio::test]
async fn with_every_connection_busy_the_reserve_answers_probes_only() {
    for tls in [false, true] {
        let server = start(
            tls,
            limits()
                .with_header_timeout(Duration::from_secs(60))
                .with_max_connections(2)
                .with_probe_reserve(1)
                .with_probe_paths(["/livez"]),
        )
        .await;
        let mut busy = Vec::new();
        for _ in 0..2 {
            let mut conn = server.connect().await;
            conn.write_all(b"GET /hold HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .await
                .unwrap();
            busy.push(conn);
        }
        server.entered(2).await;
        for _ in 0..3 {
            let (status, head, body) = server.get("/livez").await;
            assert_eq!((status, body.as_str()), (200, "ok"), "tls {tls}");
            assert!(
                head.to_ascii_lowercase().contains("connection: close"),
                "{head}"
            );
            let (status, head, _) = server.get("/hello").await;
            assert_eq!(status, 503, "tls {tls}");
            assert!(
                head.to_ascii_lowercase().contains("retry-after: 1"),
                "{head}"
            );
        }
        server.hold.release.add_permits(2);
        for conn in &mut busy {
            assert_eq!(read_response(conn).await.2, "held");
        }
        // Both connections are idle again: a new one takes the place of one.
        assert_eq!(server.get("/hello").await.2, "hello", "tls {tls}");
    }
}

/// Shutdown closes idle connections, answers the request in flight, then `serve`
/// returns.
#[tokio::test]
async fn shutdown_answers_what_is_in_flight_and_closes_idle_connections() {
    let mut server = start(true, limits().with_header_timeout(Duration::from_secs(60))).await;
    let mut idle = server.connect().await;
    assert_eq!(request(&mut idle, "/hello").await.2, "hello");
    let mut holding = server.connect().await;
    holding
        .write_all(b"GET /hold HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    server.entered(1).await;
    let _ = server.stop.take().unwrap().send(());
    let started = Instant::now();
    closed_after(&mut idle, started).await;
    assert!(
        !server.task.is_finished(),
        "serve returned with a request in flight"
    );
    server.hold.release.add_permits(1);
    let (status, head, body) = read_response(&mut holding).await;
    assert_eq!((status, body.as_str()), (200, "held"));
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("serve returns once every connection closed")
        .unwrap();
    // Nothing listens any more.
    assert!(TcpStream::connect(server.addr).await.is_err());
}

/// A client certificate reaches the service factory as the peer's.
#[tokio::test]
async fn the_factory_sees_the_client_certificate() {
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let client_cert = rcgen::generate_simple_self_signed(vec!["client".to_owned()]).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client_roots = rustls::RootCertStore::empty();
    client_roots.add(client_cert.cert.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(client_roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .unwrap();
    let server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![ca.cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ca.key_pair.serialize_der())),
        )
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        Transport::Tls(Arc::new(server_config)),
        limits(),
        |peer: &palisade_listen::Peer| {
            let n = peer.client_certificates().map_or(0, <[_]>::len);
            Router::new().route("/certs", get(move || async move { n.to_string() }))
        },
        std::future::pending(),
    ));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    for (with_cert, expect) in [(false, "0"), (true, "1")] {
        let config = if with_cert {
            builder
                .clone()
                .with_client_auth_cert(
                    vec![client_cert.cert.der().clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                        client_cert.key_pair.serialize_der(),
                    )),
                )
                .unwrap()
        } else {
            builder.clone().with_no_client_auth()
        };
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(request(&mut tls, "/certs").await.2, expect);
    }
}
