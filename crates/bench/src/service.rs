//! The lock service over HTTP with mTLS against the core in process: what the service
//! adds to an acquire.
//!
//! One etcd member, one `Locker`; the service (`serve_tls`, client certificates from a CA
//! made here with rcgen, callers named by their SPIFFE URI SAN) runs in this process on
//! loopback. Each client keeps one mTLS connection (keep-alive, so handshakes are not
//! counted) and one session, and runs acquire + release cycles on random keys among
//! 1,000 (uncontended). The first table gives the acquire latency alone, the cycle rate,
//! and the unary calls etcd served per cycle (from its own `grpc_server_handled_total`,
//! read before and after each variant runs alone for one round). The second runs the
//! service's clients all in one namespace, then each in its own, one after the other
//! in rounds: a namespace's quota must not serialize its acquires.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use palisade_lock::{LockClass, LockName, Locker, Mode, Namespace, Session, SpiffeId};
use palisade_server::testing::{serve_tls_on_loopback, ServiceFixture};
use palisade_server::{server_config, Authz, AuthzConfig, ServiceOptions};
use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_json::{json, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::drive::{drive, interleave, Op};
use crate::error::{BenchError, Result};
use crate::etcd_ops::unary_calls;
use crate::report::{f, histogram, ratio, record, Table};

/// The authorization: namespace `bench` and `bench0` .. `bench<n-1>`, class `c` of each
/// open to every bench identity.
fn authz(n: usize) -> String {
    let mut text = String::from("admins = [\"spiffe://bench/ops\"]\n");
    for ns in std::iter::once("bench".to_owned()).chain((0..n).map(|i| format!("bench{i}"))) {
        text.push_str(&format!(
            "[[namespace]]\nid = \"{ns}\"\n[[namespace.grant]]\nids = [\"spiffe://bench/\"]\nclasses = [\"c\"]\n"
        ));
    }
    text
}

/// The variants, in the order they take turns.
pub(crate) const VARIANTS: [&str; 2] = ["core in process", "service over HTTP + mTLS"];

type Svid = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

struct Pki {
    ca: Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new() -> std::result::Result<Pki, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "palisade-bench CA");
        let ca = params.self_signed(&ca_key)?;
        Ok(Pki { ca, ca_key })
    }

    fn leaf(&self, uri: Option<&str>) -> std::result::Result<Svid, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        if let Some(u) = uri {
            params.subject_alt_names.push(SanType::URI(u.try_into()?));
        }
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        Ok((
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        ))
    }
}

fn setup(_: impl std::fmt::Debug) -> BenchError {
    BenchError::Unexpected("the mTLS setup failed")
}

/// Runs the comparison at each client count.
pub(crate) async fn run(clients: &[usize], secs: Duration, rounds: usize) -> Result<Vec<Table>> {
    let fixture = ServiceFixture::start(1, Duration::from_secs(2))
        .await
        .map_err(|_| BenchError::Unexpected("etcd or the locker did not start"))?;
    let most = clients.iter().copied().max().unwrap_or(1);
    for ns in std::iter::once("bench".to_owned()).chain((0..most).map(|i| format!("bench{i}"))) {
        // The bench measures the hot path, not the rate limit: a namespace's default
        // op_rate_quota (1,000 operations per second) is below what one member serves.
        let mut namespace = Namespace::new(&ns, "bench");
        namespace.op_rate_quota = u32::MAX;
        fixture
            .configure(&namespace, &LockClass::new(&ns, "c", ""))
            .await?;
    }
    let endpoints = fixture.cluster.endpoints();
    let locker = fixture.locker.clone();

    let pki = Pki::new().map_err(setup)?;
    let (chain, key) = pki.leaf(None).map_err(setup)?;
    let tls = server_config(vec![pki.ca.der().clone()], chain, key).map_err(setup)?;
    let authz = Authz::fixed(AuthzConfig::from_toml(&authz(most)).map_err(setup)?);
    let server = serve_tls_on_loopback(locker.clone(), tls, ServiceOptions::new(authz)).await?;
    let addr = server.addr;

    let mut table = Table::new(
        format!(
            "Lock service over HTTP with mTLS vs the core in process (1 etcd member, 1,000 keys, {} s x {rounds} rounds per cell; ratio = median of per-round ratios)",
            secs.as_secs_f64()
        ),
        &["clients", "variant", "cycles/s", "acquire p50 ms", "acquire p99 ms", "added acquire p50 ms", "vs core", "etcd unary calls per cycle"],
    );
    let mut spread = Table::new(
        format!(
            "The service's clients in one namespace vs each in its own (1 etcd member, 1,000 keys per namespace, {} s x {rounds} rounds per cell; ratio = median of per-round ratios)",
            secs.as_secs_f64()
        ),
        &["clients", "namespaces", "cycles/s", "acquire p50 ms", "vs one namespace"],
    );
    for &c in clients {
        eprintln!("service: {c} clients");
        let acquire: Vec<Arc<std::sync::Mutex<Histogram<u64>>>> = VARIANTS
            .iter()
            .map(|_| Arc::new(std::sync::Mutex::new(histogram())))
            .collect();
        let mut core_ops: Vec<Op> = Vec::with_capacity(c);
        let mut svc_ops: Vec<Op> = Vec::with_capacity(c);
        // What the service variant's ops are made of, to make more of them below.
        let mut svc_parts = Vec::with_capacity(c);
        let mut sessions = Vec::new();
        for i in 0..c {
            let seed = 0x2545_f491_4f6c_dd1d_u64 ^ ((i as u64 + 1) << 21);
            let id = format!("spiffe://bench/w{i}");
            let session = Arc::new(
                locker
                    .open_session(
                        SpiffeId::new(id.as_str()).map_err(palisade_lock::Error::from)?,
                        Duration::from_secs(30),
                    )
                    .await?,
            );
            sessions.push(Arc::clone(&session));
            core_ops.push(core_op(
                locker.clone(),
                session,
                seed,
                Arc::clone(&acquire[0]),
            ));
            let svid = pki.leaf(Some(&id)).map_err(setup)?;
            let conn = connect(addr, &pki.ca, svid).await?;
            let conn = Arc::new(Mutex::new(conn));
            let opened = call(&conn, "/v1/sessions", json!({ "ttl_ms": 30_000 })).await?;
            let sid = opened["session"]
                .as_str()
                .ok_or(BenchError::Unexpected("no session id"))?
                .to_owned();
            svc_ops.push(service_op(
                Arc::clone(&conn),
                sid.clone(),
                "bench".to_owned(),
                seed,
                Arc::clone(&acquire[1]),
            ));
            svc_parts.push((conn, sid, seed));
        }
        let run = interleave(vec![core_ops, svc_ops], rounds, secs).await?;
        // The service's sessions live by keepalive (30 s TTL): renew them between phases.
        renew(&svc_parts).await?;
        // etcd's calls per cycle: each variant alone for one round, after the rounds.
        let mut per_cycle = Vec::new();
        for v in 0..VARIANTS.len() {
            let ops = if v == 0 {
                sessions
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        core_op(locker.clone(), Arc::clone(s), svc_parts[i].2 ^ 7, scratch())
                    })
                    .collect()
            } else {
                svc_parts
                    .iter()
                    .map(|(conn, sid, seed)| {
                        service_op(
                            Arc::clone(conn),
                            sid.clone(),
                            "bench".to_owned(),
                            seed ^ 7,
                            scratch(),
                        )
                    })
                    .collect()
            };
            let before = unary_calls(&endpoints).await?;
            let (_, sample) = drive(ops, secs).await?;
            let after = unary_calls(&endpoints).await?;
            per_cycle.push(after.saturating_sub(before) as f64 / sample.ops.max(1) as f64);
        }
        renew(&svc_parts).await?;
        if c > 1 {
            let spread_hist = [scratch(), scratch()];
            let one: Vec<Op> = svc_parts
                .iter()
                .map(|(conn, sid, seed)| {
                    service_op(
                        Arc::clone(conn),
                        sid.clone(),
                        "bench".to_owned(),
                        *seed,
                        Arc::clone(&spread_hist[0]),
                    )
                })
                .collect();
            let many: Vec<Op> = svc_parts
                .iter()
                .enumerate()
                .map(|(i, (conn, sid, seed))| {
                    service_op(
                        Arc::clone(conn),
                        sid.clone(),
                        format!("bench{i}"),
                        *seed,
                        Arc::clone(&spread_hist[1]),
                    )
                })
                .collect();
            let r = interleave(vec![one, many], rounds, secs).await?;
            for (v, s) in r.merged.iter().enumerate() {
                let p50 = spread_hist[v]
                    .lock()
                    .map(|h| h.value_at_quantile(0.5) as f64 / 1_000.0)
                    .unwrap_or(0.0);
                spread.row(vec![
                    c.to_string(),
                    if v == 0 {
                        "1".to_owned()
                    } else {
                        c.to_string()
                    },
                    f(s.rate(), 0),
                    f(p50, 2),
                    ratio(r.ratio(v, 0)),
                ]);
            }
        }
        let p = |v: usize, q: f64| {
            acquire[v]
                .lock()
                .map(|h| h.value_at_quantile(q) as f64 / 1_000.0)
                .unwrap_or(0.0)
        };
        for (v, s) in run.merged.iter().enumerate() {
            table.row(vec![
                c.to_string(),
                VARIANTS[v].to_owned(),
                f(s.rate(), 0),
                f(p(v, 0.5), 2),
                f(p(v, 0.99), 2),
                if v == 0 {
                    "-".to_owned()
                } else {
                    f(p(v, 0.5) - p(0, 0.5), 2)
                },
                ratio(run.ratio(v, 0)),
                f(per_cycle[v], 2),
            ]);
        }
        for s in sessions {
            if let Ok(s) = Arc::try_unwrap(s) {
                let _ = s.close().await;
            }
        }
    }
    server.stop();
    Ok(vec![table, spread])
}

/// Renews each service session once.
async fn renew(parts: &[(Arc<Mutex<Conn>>, String, u64)]) -> Result<()> {
    for (conn, sid, _) in parts {
        call(conn, &format!("/v1/sessions/{sid}/keepalive"), json!({})).await?;
    }
    Ok(())
}

/// A histogram nobody reads: for the runs whose latencies are not reported.
fn scratch() -> Arc<std::sync::Mutex<Histogram<u64>>> {
    Arc::new(std::sync::Mutex::new(histogram()))
}

fn key(rng: &mut u64) -> String {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    format!("k{}", *rng % 1_000)
}

fn core_op(
    locker: Locker,
    session: Arc<Session>,
    mut rng: u64,
    hist: Arc<std::sync::Mutex<Histogram<u64>>>,
) -> Op {
    Box::new(move || {
        let name = LockName::new("bench", "c", key(&mut rng));
        let (locker, session, hist) = (locker.clone(), Arc::clone(&session), Arc::clone(&hist));
        Box::pin(async move {
            let t = Instant::now();
            let hold = locker
                .acquire(
                    &session,
                    &name,
                    Mode::Exclusive,
                    Instant::now() + Duration::from_secs(30),
                )
                .await?;
            if let Ok(mut h) = hist.lock() {
                record(&mut h, t.elapsed());
            }
            hold.release().await?;
            Ok(())
        })
    })
}

type Conn = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

fn service_op(
    conn: Arc<Mutex<Conn>>,
    session: String,
    ns: String,
    mut rng: u64,
    hist: Arc<std::sync::Mutex<Histogram<u64>>>,
) -> Op {
    Box::new(move || {
        let k = key(&mut rng);
        let (conn, session, hist, ns) = (
            Arc::clone(&conn),
            session.clone(),
            Arc::clone(&hist),
            ns.clone(),
        );
        Box::pin(async move {
            let t = Instant::now();
            let held = call(
                &conn,
                "/v1/locks/acquire",
                json!({ "session": session, "namespace": ns, "class": "c", "key": k, "mode": "exclusive", "wait_ms": 30_000 }),
            )
            .await?;
            if let Ok(mut h) = hist.lock() {
                record(&mut h, t.elapsed());
            }
            if held["token"].as_str().is_none() {
                return Err(BenchError::Unexpected(
                    "an acquire over the service gave no token",
                ));
            }
            call(
                &conn,
                "/v1/locks/release",
                json!({ "session": session, "namespace": ns, "class": "c", "key": k, "mode": "exclusive", "grant_rev": held["grant_rev"] }),
            )
            .await?;
            Ok(())
        })
    })
}

async fn connect(addr: std::net::SocketAddr, ca: &Certificate, (chain, key): Svid) -> Result<Conn> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).map_err(setup)?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(setup)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(setup)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("localhost").map_err(setup)?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// `POST path` with a JSON body; the JSON answer (`null` for 204). Any status above 299
/// is an error.
async fn call(conn: &Mutex<Conn>, path: &str, body: Value) -> Result<Value> {
    let bytes = serde_json::to_vec(&body)
        .map_err(|_| BenchError::Unexpected("a body did not serialize"))?;
    let req = http::Request::post(path)
        .header(http::header::HOST, "localhost")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|_| BenchError::Unexpected("request did not build"))?;
    let mut c = conn.lock().await;
    c.ready().await?;
    let res = c.send_request(req).await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        eprintln!("{path}: {status} {}", String::from_utf8_lossy(&body));
        return Err(BenchError::Unexpected("the service refused a request"));
    }
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body)
        .map_err(|_| BenchError::Unexpected("the service answered no JSON"))
}
