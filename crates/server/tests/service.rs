//! The lock service over real HTTP on loopback, against real etcd members started by the
//! test harness. Every test that starts etcd has `etcd` in its name.

use palisade_api::ProblemKind;
use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::GetOptions;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_lock::{LockClass, Locker, Namespace};
use palisade_server::testing::{serve_dev_on_loopback, Served, ServiceFixture};
use palisade_server::{Authz, AuthzConfig, ServiceOptions, DEV_IDENTITY_HEADER};
use serde_json::{json, Value};

#[path = "service/attempts.rs"]
mod attempts;
#[path = "service/class_update.rs"]
mod class_update;
#[path = "service/epoch_store.rs"]
mod epoch_store;
#[path = "service/force_retry.rs"]
mod force_retry;
#[path = "service/foreign_keys.rs"]
mod foreign_keys;
#[path = "service/holder_meta.rs"]
mod holder_meta;
#[path = "service/lock_edges.rs"]
mod lock_edges;
#[path = "service/observability.rs"]
mod observability;
#[path = "service/openapi.rs"]
mod openapi;
#[path = "service/schemathesis.rs"]
mod schemathesis;
#[path = "service/session_quota.rs"]
mod session_quota;
#[path = "service/text_input.rs"]
mod text_input;

const OWNER: &str = "spiffe://test/billing/a";
const OTHER: &str = "spiffe://test/billing/b";
const STRANGER: &str = "spiffe://test/nobody";
const ADMIN: &str = "spiffe://test/ops";

const AUTHZ: &str = r#"
admins = ["spiffe://test/ops"]
[[namespace]]
id = "ns"
[[namespace.grant]]
ids = ["spiffe://test/billing/"]
classes = ["c"]
"#;

/// A [`ServiceFixture`] and the replicas serving it.
struct Fixture {
    service: ServiceFixture,
    replicas: Vec<Served>,
}

impl std::ops::Deref for Fixture {
    type Target = ServiceFixture;
    fn deref(&self) -> &ServiceFixture {
        &self.service
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut ServiceFixture {
        &mut self.service
    }
}

async fn start_replica(locker: Locker, options: ServiceOptions) -> Served {
    serve_dev_on_loopback(locker, options).await.unwrap()
}

fn options() -> ServiceOptions {
    ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(AUTHZ).unwrap()))
        .insecure_dev_identity()
        .with_body_limit(4096)
}

/// etcd, one namespace `ns` with an exclusive class `c` (prefix ""), and `n` replicas,
/// each with its own locker (sharing the durable epoch record, as replicas share a volume).
async fn fixture(n: usize) -> Fixture {
    fixture_with_timeout(n, Duration::from_millis(500)).await
}

/// [`fixture`] with another etcd request timeout for every locker.
async fn fixture_with_timeout(n: usize, request_timeout: Duration) -> Fixture {
    let service = ServiceFixture::start(1, request_timeout).await.unwrap();
    let mut c = LockClass::new("ns", "c", "");
    c.ttl_max = Duration::from_secs(30);
    service
        .configure(&Namespace::new("ns", "tenant"), &c)
        .await
        .unwrap();
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(start_replica(service.connect().await.unwrap(), options()).await);
    }
    Fixture { service, replicas }
}

struct Resp {
    status: u16,
    content_type: String,
    /// The `Retry-After` header, in seconds.
    retry_after: Option<u64>,
    body: Value,
}

async fn call_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    identity: Option<&str>,
    body: Vec<u8>,
) -> Resp {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    if let Some(id) = identity {
        req = req.header(DEV_IDENTITY_HEADER, id);
    }
    let resp = client
        .request(req.body(Full::new(bytes::Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else if content_type.starts_with("text/plain") {
        Value::String(String::from_utf8(bytes.to_vec()).unwrap())
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Resp {
        status,
        content_type,
        retry_after,
        body,
    }
}

async fn call(addr: SocketAddr, method: &str, path: &str, id: &str, body: Value) -> Resp {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    call_raw(addr, method, path, Some(id), bytes).await
}

fn assert_problem(r: &Resp, status: u16, slug: &str) {
    assert_eq!(r.status, status, "{:?}", r.body);
    assert_eq!(r.content_type, "application/problem+json");
    assert_eq!(
        r.body["type"],
        format!("urn:palisade:problem:{slug}"),
        "{:?}",
        r.body
    );
    assert_eq!(r.body["status"], status);
}

async fn open(addr: SocketAddr, id: &str, ttl_ms: u64) -> String {
    let r = call(
        addr,
        "POST",
        "/v1/sessions",
        id,
        json!({ "ttl_ms": ttl_ms }),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    r.body["session"].as_str().unwrap().to_owned()
}

fn acquire_body(session: &str, key: &str, wait_ms: u64) -> Value {
    json!({ "session": session, "namespace": "ns", "class": "c", "key": key,
            "mode": "exclusive", "wait_ms": wait_ms })
}

/// Every key under the root prefix, for "nothing was written" checks.
async fn keys(f: &Fixture) -> Vec<String> {
    let mut c = f.locker.client().clone();
    let resp = c
        .get(
            "/palisade/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

#[tokio::test]
async fn etcd_two_replicas_one_queue_increasing_tokens() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    // A session opened on replica A acquires through replica B.
    let s1 = open(a, OWNER, 10_000).await;
    let r = call(
        b,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s1, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let t1: u64 = r.body["token"].as_str().unwrap().parse().unwrap();
    let rev1 = r.body["grant_rev"].as_u64().unwrap();
    assert_eq!(t1, rev1, "epoch 0: the token is the grant revision");

    // Another session queues behind it (long-poll) on replica A.
    let s2 = open(b, OTHER, 10_000).await;
    let waiter = tokio::spawn(async move {
        call(
            a,
            "POST",
            "/v1/locks/acquire",
            OTHER,
            acquire_body(&s2, "k", 10_000),
        )
        .await
    });
    // Status from either replica shows one holder and one waiter.
    let mut seen = false;
    for _ in 0..50 {
        let st = call(
            b,
            "GET",
            "/v1/locks/status?namespace=ns&class=c&key=k",
            ADMIN,
            Value::Null,
        )
        .await;
        assert_eq!(st.status, 200, "{:?}", st.body);
        assert_eq!(st.body["holders"][0]["session"], s1.as_str());
        assert_eq!(st.body["holders"][0]["token"], t1.to_string());
        if st.body["waiters"].as_array().unwrap().len() == 1 {
            assert_eq!(st.body["waiters"][0]["spiffe_id"], OTHER);
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen, "the waiter never showed up in the queue");
    assert!(
        !waiter.is_finished(),
        "the waiter must long-poll while the lock is held"
    );

    // Keepalive on B, release on A: the waiter is granted with a higher token.
    let r = call(
        b,
        "POST",
        &format!("/v1/sessions/{s1}/keepalive"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["ttl_ms"], 10_000);
    let rel = json!({ "session": s1, "namespace": "ns", "class": "c", "key": "k",
                      "mode": "exclusive", "grant_rev": rev1 });
    let r = call(a, "POST", "/v1/locks/release", OWNER, rel.clone()).await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    let w = waiter.await.unwrap();
    assert_eq!(w.status, 200, "{:?}", w.body);
    let t2: u64 = w.body["token"].as_str().unwrap().parse().unwrap();
    assert!(t2 > t1, "{t2} <= {t1}");
    // Releasing again: not held.
    let r = call(b, "POST", "/v1/locks/release", OWNER, rel).await;
    assert_problem(&r, 409, "not-held");

    // Close ends the session and its holds; afterwards it is not found.
    let r = call(
        a,
        "DELETE",
        &format!("/v1/sessions/{s1}"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 204);
    let r = call(
        b,
        "POST",
        &format!("/v1/sessions/{s1}/keepalive"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_problem(&r, 404, "not-found");
    drop(f);
}

#[tokio::test]
async fn etcd_wait_deadline_and_closed_session_free_the_lock() {
    let f = fixture(1).await;
    let a = f.replicas[0].addr;
    let s1 = open(a, OWNER, 10_000).await;
    let s2 = open(a, OTHER, 10_000).await;
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s1, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200);
    let started = std::time::Instant::now();
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&s2, "k", 300),
    )
    .await;
    assert_problem(&r, 409, "deadline-exceeded");
    assert!(started.elapsed() >= Duration::from_millis(300));
    // The timed-out waiter left no waiter key behind.
    assert!(
        !keys(&f).await.iter().any(|k| k.contains("/q/")),
        "{:?}",
        keys(&f).await
    );
    // Closing the holder's session frees the lock for the other at once.
    let r = call(
        a,
        "DELETE",
        &format!("/v1/sessions/{s1}"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 204);
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&s2, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
}

#[tokio::test]
async fn etcd_foreign_identity_cannot_touch_a_session() {
    let f = fixture(1).await;
    let a = f.replicas[0].addr;
    let s1 = open(a, OWNER, 10_000).await;
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s1, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200);
    let rev = r.body["grant_rev"].as_u64().unwrap();
    // OTHER may lock class c, but not through OWNER's session.
    let r = call(
        a,
        "POST",
        &format!("/v1/sessions/{s1}/keepalive"),
        OTHER,
        Value::Null,
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    let r = call(
        a,
        "DELETE",
        &format!("/v1/sessions/{s1}"),
        OTHER,
        Value::Null,
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    let rel = json!({ "session": s1, "namespace": "ns", "class": "c", "key": "k",
                      "mode": "exclusive", "grant_rev": rev });
    let r = call(a, "POST", "/v1/locks/release", OTHER, rel).await;
    assert_problem(&r, 403, "forbidden");
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&s1, "k2", 1000),
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    // A stranger may not lock the class at all, even with its own session.
    let s3 = open(a, STRANGER, 10_000).await;
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        STRANGER,
        acquire_body(&s3, "k3", 1000),
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    // Nothing of the above changed the hold or wrote a key.
    let st = call(
        a,
        "GET",
        "/v1/locks/status?namespace=ns&class=c&key=k",
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(st.body["holders"].as_array().unwrap().len(), 1);
    assert_eq!(st.body["holders"][0]["grant_rev"], rev);
    let ks = keys(&f).await;
    assert!(
        !ks.iter().any(|k| k.contains("/k2/") || k.contains("/k3/")),
        "{ks:?}"
    );
    // No identity at all: 401.
    let r = call_raw(
        a,
        "POST",
        "/v1/sessions",
        None,
        br#"{"ttl_ms":1000}"#.to_vec(),
    )
    .await;
    assert_problem(&r, 401, "unauthenticated");
}

#[tokio::test]
async fn etcd_dev_header_is_refused_without_dev_mode() {
    let f = fixture(0).await;
    let options = ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(AUTHZ).unwrap()));
    // Plain HTTP without dev mode does not start at all.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    assert!(matches!(
        palisade_server::serve_dev(listener, f.locker.clone(), options.clone()).await,
        Err(palisade_server::ServeError::DevIdentityNotEnabled)
    ));
    // Dev mode refuses a non-loopback bind (when one is available).
    if let Ok(l) = tokio::net::TcpListener::bind("0.0.0.0:0").await {
        assert!(matches!(
            palisade_server::serve_dev(
                l,
                f.locker.clone(),
                options.clone().insecure_dev_identity()
            )
            .await,
            Err(palisade_server::ServeError::NotLoopback(_))
        ));
    }
    // The router without dev mode refuses the header with 401 (a TLS front end would
    // set the identity; here there is none).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = palisade_server::router(f.locker.clone(), options);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let r = call(
        addr,
        "POST",
        "/v1/sessions",
        OWNER,
        json!({ "ttl_ms": 5000 }),
    )
    .await;
    assert_problem(&r, 401, "unauthenticated");
    assert!(r.body["detail"]
        .as_str()
        .unwrap()
        .contains("dev identity header"));
    assert!(!keys(&f).await.iter().any(|k| k.contains("sessions/")));
}

#[tokio::test]
async fn etcd_bad_input_is_4xx_problem_json_and_writes_nothing() {
    let f = fixture(1).await;
    let a = f.replicas[0].addr;
    let s = open(a, OWNER, 10_000).await;
    let before = keys(&f).await;
    let cases: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        ("POST", "/v1/sessions", b"{\"ttl_ms\": ".to_vec(), 400),
        ("POST", "/v1/sessions", br#"{"ttl_ms": -5}"#.to_vec(), 422),
        (
            "POST",
            "/v1/sessions",
            br#"{"ttl_ms": 99999999999999999999999}"#.to_vec(),
            422,
        ),
        (
            "POST",
            "/v1/sessions",
            br#"{"ttl_ms": 18446744073709551615}"#.to_vec(),
            400,
        ),
        ("POST", "/v1/sessions", br#"{"ttl_ms": 1500}"#.to_vec(), 400),
        ("POST", "/v1/sessions", br#"{"ttl_ms": 0}"#.to_vec(), 400),
        (
            "POST",
            "/v1/sessions",
            br#"{"ttl_ms": 5000, "extra": 1}"#.to_vec(),
            422,
        ),
        ("POST", "/v1/sessions", vec![b' '; 5000], 413),
        // serde would read a struct from an array of its fields in order.
        ("POST", "/v1/sessions", b"[5000]".to_vec(), 422),
        ("POST", "/v1/sessions", b"5000".to_vec(), 422),
        ("POST", "/v1/sessions/zz/keepalive", Vec::new(), 400),
        (
            "POST",
            "/v1/sessions",
            b"{\"ttl_\xff\": 5000}".to_vec(),
            400,
        ),
    ];
    for (method, path, body, status) in cases {
        let r = call_raw(a, method, path, Some(OWNER), body.clone()).await;
        assert_problem(&r, status, "invalid-input");
    }
    let r = call_raw(a, "POST", "/v1/sessions", Some(OWNER), b"[5000]".to_vec()).await;
    let detail = r.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("expected a JSON object"), "{detail}");
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "inv-\u{202E}fdp", 100),
    )
    .await;
    let detail = r.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("U+202E at byte 4"), "{detail}");
    // Headers a client can get wrong: two dev identities (which one acted would depend on
    // their order) is 401; a compressed (or falsely labelled) body is 415, not read as
    // plain JSON.
    let raw = |extra: String, body: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(a).await.unwrap();
        let req = format!(
            "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    };
    let ok = r#"{"ttl_ms": 5000}"#;
    let two = raw(
        format!("{DEV_IDENTITY_HEADER}: {OWNER}\r\n{DEV_IDENTITY_HEADER}: spiffe://acme/other\r\n"),
        ok,
    )
    .await;
    assert!(two.starts_with("HTTP/1.1 401"), "{two}");
    assert!(two.contains("sent more than once"), "{two}");
    let gz = raw(
        format!("{DEV_IDENTITY_HEADER}: {OWNER}\r\nContent-Encoding: gzip\r\n"),
        ok,
    )
    .await;
    assert!(gz.starts_with("HTTP/1.1 415"), "{gz}");
    assert!(
        gz.contains("Content-Encoding \\\"gzip\\\" is not supported"),
        "{gz}"
    );
    // `identity` is no coding: the body is read (and its TTL of 0 refused; nothing is
    // written in this test).
    let plain = raw(
        format!("{DEV_IDENTITY_HEADER}: {OWNER}\r\nContent-Encoding: identity\r\n"),
        r#"{"ttl_ms": 0}"#,
    )
    .await;
    assert!(plain.starts_with("HTTP/1.1 400"), "{plain}");
    assert!(plain.contains("ttl"), "{plain}");
    // A key that is not UTF-8 once decoded is refused, not read as U+FFFD.
    let r = call_raw(
        a,
        "GET",
        "/v1/locks/status?namespace=ns&class=c&key=%FF",
        Some(OWNER),
        Vec::new(),
    )
    .await;
    assert_problem(&r, 400, "invalid-input");
    let detail = r.body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("query parameter \"key\" is not UTF-8"),
        "{detail}"
    );
    // Acquire input errors: key not UTF-8, key with `..`, control character, negative
    // wait, wait over the limit, unknown mode, unknown class (404).
    let mut bad_utf8 = br#"{"session":""#.to_vec();
    bad_utf8.extend_from_slice(s.as_bytes());
    bad_utf8.extend_from_slice(b"\",\"namespace\":\"ns\",\"class\":\"c\",\"key\":\"a\xc3\x28\",\"mode\":\"exclusive\",\"wait_ms\":100}");
    let r = call_raw(a, "POST", "/v1/locks/acquire", Some(OWNER), bad_utf8).await;
    assert_problem(&r, 400, "invalid-input");
    for (body, status, slug) in [
        (acquire_body(&s, "a/../b", 100), 400, "invalid-input"),
        (acquire_body(&s, "a\u{1}b", 100), 400, "invalid-input"),
        (acquire_body(&s, "a\u{85}b", 100), 400, "invalid-input"),
        (
            acquire_body(&s, "inv-\u{202E}fdp", 100),
            400,
            "invalid-input",
        ),
        (
            json!([s, "ns", "c", "k", "exclusive", 100]),
            422,
            "invalid-input",
        ),
        (acquire_body(&s, "", 100), 400, "invalid-input"),
        (acquire_body(&s, "k", 3_600_000), 400, "invalid-input"),
        (
            json!({ "session": s, "namespace": "ns", "class": "c", "key": "k", "mode": "exclusive", "wait_ms": -1 }),
            422,
            "invalid-input",
        ),
        (
            json!({ "session": s, "namespace": "ns", "class": "c", "key": "k", "mode": "both", "wait_ms": 100 }),
            422,
            "invalid-input",
        ),
        (
            json!({ "session": "0000000000000001", "namespace": "ns", "class": "c", "key": "k", "mode": "exclusive", "wait_ms": 100 }),
            404,
            "not-found",
        ),
    ] {
        let r = call(a, "POST", "/v1/locks/acquire", OWNER, body.clone()).await;
        assert_problem(&r, status, slug);
    }
    // Unknown route and method.
    assert_problem(
        &call(a, "GET", "/v1/nope", OWNER, Value::Null).await,
        404,
        "not-found",
    );
    assert_problem(
        &call(a, "GET", "/v1/locks/acquire", OWNER, Value::Null).await,
        405,
        "invalid-input",
    );
    assert_eq!(keys(&f).await, before, "bad input wrote to etcd");
}

#[tokio::test]
async fn etcd_admin_namespaces_classes_epochs() {
    let f = fixture(1).await;
    let a = f.replicas[0].addr;
    let r = call(
        a,
        "PUT",
        "/v1/namespaces/orders",
        OWNER,
        json!({ "tenant_id": "acme" }),
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    let r = call(
        a,
        "PUT",
        "/v1/namespaces/orders",
        ADMIN,
        json!({ "tenant_id": "acme", "held_lease_quota": 7 }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = call(a, "PUT", "/v1/namespaces/orders/classes/rows", ADMIN,
        json!({ "key_prefix": "row/", "ttl_min_ms": 2000, "ttl_max_ms": 9000, "mode": "shared", "lock_delay_ms": 250 })).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = call(
        a,
        "PUT",
        "/v1/namespaces/orders/classes/bad",
        ADMIN,
        json!({ "key_prefix": "row/x", "ttl_min_ms": 1000 }),
    )
    .await;
    assert_problem(&r, 400, "invalid-input"); // overlaps rows' prefix

    // Status of a key outside the class's prefix is refused as acquire refuses it.
    let status = |key: &str| format!("/v1/locks/status?namespace=orders&class=rows&key={key}");
    let r = call(a, "GET", &status("other"), ADMIN, Value::Null).await;
    assert_problem(&r, 400, "invalid-input");
    assert!(
        r.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("outside the class's key prefix \"row/\"")),
        "{:?}",
        r.body
    );
    let r = call(a, "GET", &status("row/1"), ADMIN, Value::Null).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = call(a, "PUT", "/v1/namespaces/nope/classes/x", ADMIN, json!({})).await;
    assert_problem(&r, 404, "not-found");
    let r = call(a, "GET", "/v1/namespaces", ADMIN, Value::Null).await;
    let ids: Vec<&str> = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ns", "orders"]);
    assert_eq!(r.body[1]["held_lease_quota"], 7);
    let r = call(
        a,
        "GET",
        "/v1/namespaces/orders/classes",
        ADMIN,
        Value::Null,
    )
    .await;
    assert_eq!(r.body.as_array().unwrap().len(), 1);
    assert_eq!(r.body[0]["mode"], "shared");
    assert_eq!(r.body[0]["ttl_max"], 9000);
    assert_eq!(r.body[0]["lock_delay"], 250);
    // A non-admin sees no namespaces.
    let r = call(a, "GET", "/v1/namespaces", OWNER, Value::Null).await;
    assert_eq!(r.body, json!([]));

    let r = call(a, "GET", "/v1/epoch", ADMIN, Value::Null).await;
    assert_eq!(r.body["epoch"], 0);
    assert_eq!(r.body["grants_refused"], Value::Null);
    let r = call(
        a,
        "POST",
        "/v1/epoch/advance",
        OWNER,
        json!({ "reason": "restore" }),
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    let r = call(
        a,
        "POST",
        "/v1/epoch/advance",
        ADMIN,
        json!({ "reason": "bootstrap" }),
    )
    .await;
    assert_problem(&r, 422, "invalid-input");
    let r = call(
        a,
        "POST",
        "/v1/epoch/advance",
        ADMIN,
        json!({ "reason": "restore" }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["epoch"], 1);
    assert_eq!(r.body["reason"], "restore");
    // Tokens of the new epoch carry it in the top bits.
    let s = open(a, OWNER, 10_000).await;
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let t: u64 = r.body["token"].as_str().unwrap().parse().unwrap();
    assert_eq!(t >> 48, 1);
    assert_eq!(t & ((1 << 48) - 1), r.body["grant_rev"].as_u64().unwrap());
    // The epoch shows the newest grant this replica minted, not just the confirmed one.
    let grant_rev = r.body["grant_rev"].clone();
    let r = call(a, "GET", "/v1/epoch", ADMIN, Value::Null).await;
    assert_eq!(r.body["minted_rev"], grant_rev, "{:?}", r.body);
    assert!(r.body["highest_grant_rev"].as_u64() <= grant_rev.as_u64());
}

mod mtls {
    use std::sync::Arc;

    use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair, SanType};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio_rustls::TlsConnector;

    use super::*;

    struct Pki {
        ca: Certificate,
        ca_key: KeyPair,
    }

    type Svid = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

    fn dup(svid: &Svid) -> Svid {
        (svid.0.clone(), svid.1.clone_key())
    }

    impl Pki {
        fn new(name: &str) -> Pki {
            let ca_key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let ca = params.self_signed(&ca_key).unwrap();
            Pki { ca, ca_key }
        }

        /// A leaf with DNS `localhost` and the given URI SANs.
        fn leaf(&self, uris: &[&str]) -> Svid {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
            for u in uris {
                params
                    .subject_alt_names
                    .push(SanType::URI((*u).try_into().unwrap()));
            }
            let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
            (
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
        }
    }

    /// One request over a fresh mTLS connection; `Err` if the handshake or the
    /// connection failed.
    async fn tls_call(
        addr: SocketAddr,
        ca: &Certificate,
        client: Option<Svid>,
        method: &str,
        path: &str,
        body: Value,
    ) -> Result<Resp, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
            None => builder.with_no_client_auth(),
        };
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let bytes = if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(&body).unwrap()
        };
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(bytes)))
            .unwrap();
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        Ok(Resp {
            status,
            content_type,
            retry_after: None,
            body,
        })
    }

    #[tokio::test]
    async fn etcd_mtls_caller_is_the_certificate_spiffe_id() {
        let f = fixture(0).await;
        let pki = Pki::new("test CA");
        let (chain, key) = pki.leaf(&[]);
        let tls = palisade_server::server_config(vec![pki.ca.der().clone()], chain, key).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Not dev mode: identities come from client certificates only.
        let options = ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(AUTHZ).unwrap()));
        tokio::spawn(palisade_server::serve_tls(
            listener,
            tls,
            f.locker.clone(),
            options,
        ));

        // The certificate's SPIFFE ID is the caller: it owns the session it opens.
        let owner = pki.leaf(&[OWNER]);
        let r = tls_call(
            addr,
            &pki.ca,
            Some(dup(&owner)),
            "POST",
            "/v1/sessions",
            json!({ "ttl_ms": 5000 }),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 201, "{:?}", r.body);
        assert_eq!(r.body["spiffe_id"], OWNER);
        let s = r.body["session"].as_str().unwrap().to_owned();
        let r = tls_call(
            addr,
            &pki.ca,
            Some(dup(&owner)),
            "POST",
            "/v1/locks/acquire",
            acquire_body(&s, "k", 1000),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        // Another SVID of the same CA, allowed to lock the class, cannot use the session.
        let other = pki.leaf(&[OTHER]);
        let r = tls_call(
            addr,
            &pki.ca,
            Some(other),
            "POST",
            &format!("/v1/sessions/{s}/keepalive"),
            Value::Null,
        )
        .await
        .unwrap();
        assert_problem(&r, 403, "forbidden");
        // A certificate without a URI SAN, or with a non-SPIFFE one, or two: 401.
        for uris in [&[][..], &["https://example.org/x"][..], &[OWNER, OTHER][..]] {
            let r = tls_call(
                addr,
                &pki.ca,
                Some(pki.leaf(uris)),
                "POST",
                "/v1/sessions",
                json!({ "ttl_ms": 5000 }),
            )
            .await
            .unwrap();
            assert_problem(&r, 401, "unauthenticated");
        }
        // No client certificate: 401 on every route, metrics included.
        let r = tls_call(
            addr,
            &pki.ca,
            None,
            "POST",
            "/v1/sessions",
            json!({ "ttl_ms": 5000 }),
        )
        .await
        .unwrap();
        assert_problem(&r, 401, "unauthenticated");
        let r = tls_call(addr, &pki.ca, None, "GET", "/metrics", json!(null))
            .await
            .unwrap();
        assert_problem(&r, 401, "unauthenticated");
        // A certificate from another CA: the handshake is refused.
        let rogue = Pki::new("rogue CA").leaf(&[OWNER]);
        assert!(tls_call(
            addr,
            &pki.ca,
            Some(rogue),
            "POST",
            "/v1/sessions",
            json!({ "ttl_ms": 5000 })
        )
        .await
        .is_err());
        // Only the one session was opened.
        let sessions = keys(&f)
            .await
            .into_iter()
            .filter(|k| k.contains("sessions/"))
            .count();
        assert_eq!(sessions, 1);
    }
}

mod client {
    use palisade_client::{Client, ClientErrorKind};
    use palisade_lock::{LeaseId, Mode};

    use super::*;

    #[tokio::test]
    async fn etcd_client_keepalive_release_on_drop_and_lost() {
        let f = fixture(2).await;
        let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
        let alice = Client::new(format!("http://{a}"))
            .unwrap()
            .with_dev_identity(OWNER);
        let bob = Client::new(format!("http://{b}"))
            .unwrap()
            .with_dev_identity(OTHER);
        let s1 = alice.open_session(Duration::from_secs(2)).await.unwrap();
        let s2 = bob.open_session(Duration::from_secs(2)).await.unwrap();
        let hold = s1
            .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(1))
            .await
            .unwrap();
        let t1 = hold.token().unwrap();
        assert_eq!(t1.revision(), hold.grant_rev().unwrap());
        // Held past twice the TTL: the background keepalive keeps it.
        tokio::time::sleep(Duration::from_millis(4500)).await;
        assert!(!s1.is_lost());
        let e = s2
            .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            &ClientErrorKind::Problem(ProblemKind::DeadlineExceeded)
        );
        assert_eq!(e.status(), Some(409));
        // Dropping the hold releases it: Bob gets the lock, with a higher token.
        drop(hold);
        let h2 = s2
            .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(2))
            .await
            .unwrap();
        assert!(h2.token().unwrap() > t1);
        // A session that etcd loses (revoked behind the client's back) fires lost()
        // within a keepalive period or so.
        let lease = LeaseId::from_hex(s2.id()).unwrap();
        f.locker.revoke_session(lease).await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), h2.lost())
            .await
            .expect("lost() did not fire after the lease was revoked");
        let e = h2.release().await.unwrap_err();
        assert!(e.is_session_lost(), "{e:?}");
        // Closing a session fires lost() at once for its holds.
        let h3 = s1
            .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(1))
            .await
            .unwrap();
        s1.clone().close().await.unwrap();
        tokio::time::timeout(Duration::from_millis(100), h3.lost())
            .await
            .unwrap();
        let st = call(
            a,
            "GET",
            "/v1/locks/status?namespace=ns&class=c&key=k",
            ADMIN,
            Value::Null,
        )
        .await;
        assert_eq!(st.body["holders"], json!([]));
    }
}

/// The audit sink of the force release tests: keeps what it is given.
#[derive(Default, Clone)]
struct Recorded(std::sync::Arc<std::sync::Mutex<Vec<palisade_server::ForcedRelease>>>);

impl palisade_server::ForceReleaseAudit for Recorded {
    fn record(
        &self,
        release: palisade_server::ForcedRelease,
    ) -> palisade_lock::BoxFuture<'_, Result<(), Box<dyn std::error::Error + Send + Sync>>> {
        self.0.lock().unwrap().push(release);
        Box::pin(async { Ok(()) })
    }
}

const ADMIN2: &str = "spiffe://test/ops2";

/// A connection pool to `db`, as `palisade serve --database` builds one.
fn pool_of(db: &palisade_testkit::TestDb) -> deadpool_postgres::Pool {
    let manager = deadpool_postgres::Manager::from_config(
        db.config(),
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .unwrap()
}

#[tokio::test]
async fn etcd_force_release_needs_a_second_admin_and_lock_delay_holds_the_next_grant() {
    use palisade_fence::{MemoryStore, Raise};
    use std::sync::Arc;

    let f = fixture(0).await;
    let lock_delay = Duration::from_secs(2);
    let mut c = LockClass::new("ns", "c", "");
    c.ttl_max = Duration::from_secs(30);
    c.lock_delay = lock_delay;
    f.locker.config().put_class(&c).await.unwrap();

    let db = palisade_testkit::TestDb::create().await;
    let pg = Arc::new(db.connect().await);
    let recorded = Recorded::default();
    let force = palisade_server::ForceReleases::new(pool_of(&db), Arc::new(recorded.clone()));
    force.migrate().await.unwrap();
    force.migrate().await.unwrap(); // idempotent
    let authz = format!(
        "admins = [\"{ADMIN}\", \"{ADMIN2}\"]\n{}",
        AUTHZ.replace("admins = [\"spiffe://test/ops\"]", "")
    );
    let options = ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(&authz).unwrap()))
        .insecure_dev_identity()
        .with_force_releases(force);
    let addr = start_replica(f.connect().await.unwrap(), options)
        .await
        .addr;

    // The old holder holds the lock and writes to a resource.
    let sa = open(addr, OWNER, 20_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&sa, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let old_token: palisade_lock::FencingToken = r.body["token"].as_str().unwrap().parse().unwrap();
    let old_grant = r.body["grant_rev"].clone();
    let resource = MemoryStore::new(100);
    assert_eq!(resource.raise_now("res", old_token), Raise::Admitted);

    let req = json!({ "namespace": "ns", "class": "c", "key": "k", "reason": "stuck batch job" });
    // Not an admin: 403, no request.
    let r = call(addr, "POST", "/v1/force-releases", OTHER, req.clone()).await;
    assert_problem(&r, 403, "forbidden");
    // Blank reason: 400.
    let r = call(
        addr,
        "POST",
        "/v1/force-releases",
        ADMIN,
        json!({ "namespace": "ns", "class": "c", "key": "k", "reason": " " }),
    )
    .await;
    assert_problem(&r, 400, "invalid-input");
    let r = call(addr, "POST", "/v1/force-releases", ADMIN, req).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["requester"], ADMIN);
    let id = r.body["id"].as_str().unwrap().to_owned();

    // The requester cannot approve: 403, and the hold is still there.
    let approve = format!("/v1/force-releases/{id}/approve");
    let r = call(addr, "POST", &approve, ADMIN, Value::Null).await;
    assert_problem(&r, 403, "forbidden");
    let r = call(
        addr,
        "POST",
        "/v1/force-releases/nope/approve",
        ADMIN2,
        Value::Null,
    )
    .await;
    assert_problem(&r, 404, "not-found");
    let status = "/v1/locks/status?namespace=ns&class=c&key=k";
    let r = call(addr, "GET", status, ADMIN, Value::Null).await;
    assert_eq!(
        r.body["holders"].as_array().unwrap().len(),
        1,
        "{:?}",
        r.body
    );
    assert!(recorded.0.lock().unwrap().is_empty());

    // A second admin approves: the hold is deleted and recorded.
    let r = call(addr, "POST", &approve, ADMIN2, Value::Null).await;
    let approved_at = tokio::time::Instant::now();
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["approver"], ADMIN2);
    assert_eq!(r.body["class_was_fenced"], true);
    let released = r.body["released"].as_array().unwrap();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0]["session"], sa.as_str());
    assert_eq!(released[0]["token"], old_token.to_string());
    let rev = released[0]["revision"].as_u64().unwrap();
    assert!(rev > old_grant.as_u64().unwrap());
    {
        let recs = recorded.0.lock().unwrap();
        assert_eq!(recs.len(), 1);
        let rec = &recs[0];
        assert_eq!(rec.request_id, id);
        assert_eq!(rec.revision.get(), rev);
        assert_eq!(rec.cluster_id, f.locker.epoch().0.cluster_id);
        assert_eq!(rec.lock_key, "k");
        assert_eq!(
            (rec.requester.as_str(), rec.approver.as_str()),
            (ADMIN, ADMIN2)
        );
        assert_eq!(rec.reason, "stuck batch job");
        assert!(rec.class_was_fenced);
    }
    let row = pg
        .query_one(
            "SELECT requester, approver FROM force_release_request WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, Option<String>>(1)),
        (ADMIN.to_owned(), Some(ADMIN2.to_owned()))
    );
    // Approved once only.
    let r = call(addr, "POST", &approve, ADMIN2, Value::Null).await;
    assert_problem(&r, 409, "already-approved");
    assert_eq!(recorded.0.lock().unwrap().len(), 1);

    // During lock-delay: no new grant.
    let sb = open(addr, OTHER, 20_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&sb, "k", 500),
    )
    .await;
    assert_problem(&r, 409, "deadline-exceeded");
    assert!(
        approved_at.elapsed() < lock_delay,
        "the check above ran inside lock-delay"
    );
    // The window: nothing newer has been seen, so the resource still admits the old token.
    assert_eq!(resource.raise_now("res", old_token), Raise::Admitted);
    // The old holder learns it lost the hold, and that it was forced.
    let r = call(
        addr,
        "POST",
        "/v1/locks/release",
        OWNER,
        json!({ "session": sa, "namespace": "ns",
        "class": "c", "key": "k", "mode": "exclusive", "grant_rev": old_grant }),
    )
    .await;
    assert_problem(&r, 409, "hold-forced");
    assert!(
        r.body["detail"].as_str().unwrap().contains(&id),
        "{:?}",
        r.body
    );

    // After lock-delay the next holder is granted a higher token; once it writes, the old
    // token is refused.
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&sb, "k", 10_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(
        approved_at.elapsed() >= lock_delay - Duration::from_millis(300),
        "granted inside lock-delay"
    );
    let new_token: palisade_lock::FencingToken = r.body["token"].as_str().unwrap().parse().unwrap();
    assert!(new_token > old_token);
    assert_eq!(resource.raise_now("res", new_token), Raise::Admitted);
    assert_eq!(
        resource.raise_now("res", old_token),
        Raise::Stale { highest: new_token }
    );
}

/// The number of quota slots of namespace `ns` in etcd.
async fn slots(f: &Fixture) -> i64 {
    let mut c = f.locker.client().clone();
    c.get(
        "/palisade/quota/ns/",
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .unwrap()
    .count()
}

#[tokio::test]
async fn etcd_held_lease_quota_holds_under_64_concurrent_acquirers_on_2_replicas() {
    const QUOTA: u32 = 10;
    // 64 quota Txns racing on one namespace's slot range retry until one wins: on a busy
    // machine one of them can outlast the 500 ms the other tests use, and this test is
    // about the count, not about etcd's latency.
    let f = fixture_with_timeout(2, Duration::from_secs(3)).await;
    let mut ns = Namespace::new("ns", "tenant");
    ns.held_lease_quota = QUOTA;
    f.locker.config().put_namespace(&ns).await.unwrap();
    let ttl = Duration::from_secs(5);

    // 64 sessions (sessions alone take no slot), then 64 acquires of distinct keys at
    // once, half through each replica: each could be granted at once but for the quota.
    let start = tokio::time::Instant::now();
    let mut sessions = Vec::new();
    for i in 0..64 {
        let addr = f.replicas[i % 2].addr;
        sessions.push((addr, open(addr, OWNER, 5_000).await));
    }
    let last_open = tokio::time::Instant::now();
    assert_eq!(slots(&f).await, 0);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut tasks = Vec::new();
    for (i, (addr, s)) in sessions.iter().cloned().enumerate() {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            call(
                addr,
                "POST",
                "/v1/locks/acquire",
                OWNER,
                acquire_body(&s, &format!("k{i}"), 1000),
            )
            .await
        }));
    }
    let mut granted = 0;
    for t in tasks {
        let r = t.await.unwrap();
        if r.status == 200 {
            granted += 1;
        } else {
            assert_problem(&r, 429, "quota-exceeded");
            assert!(
                r.body["detail"]
                    .as_str()
                    .unwrap()
                    .contains("held_lease_quota"),
                "{:?}",
                r.body
            );
        }
    }
    assert_eq!(granted, QUOTA);
    assert_eq!(slots(&f).await, i64::from(QUOTA));
    assert!(
        start.elapsed() < ttl,
        "no session expired before the counts above"
    );

    // The sessions are not kept alive: within one TTL (plus etcd's expiry tick) of the
    // last open their holds stop counting.
    tokio::time::sleep_until(last_open + ttl + Duration::from_millis(1500)).await;
    assert_eq!(slots(&f).await, 0);

    // A timed-out waiter stops counting when its wait ends; a release frees its slot.
    let addr = f.replicas[0].addr;
    let a = open(addr, OWNER, 20_000).await;
    let b = open(f.replicas[1].addr, OTHER, 20_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&a, "w", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let grant_rev = r.body["grant_rev"].clone();
    let r = call(
        f.replicas[1].addr,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&b, "w", 300),
    )
    .await;
    assert_problem(&r, 409, "deadline-exceeded");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(slots(&f).await, 1);
    let r = call(
        addr,
        "POST",
        "/v1/locks/release",
        OWNER,
        json!({ "session": a, "namespace": "ns",
        "class": "c", "key": "w", "mode": "exclusive", "grant_rev": grant_rev }),
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(slots(&f).await, 0);
}

/// A session's record cached by one replica: the first call for it on another replica
/// reads it, ownership holds on both, a hold taken through one is released through the
/// other (which finds its quota slot), and a session closed through one is gone on the
/// other at once.
#[tokio::test]
async fn etcd_a_session_record_cached_by_one_replica_stays_true_on_both() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    let s = open(a, OWNER, 30_000).await;
    cycle(a, &s, "k0").await;
    cycle(b, &s, "k1").await;
    for addr in [a, b] {
        let r = call(
            addr,
            "POST",
            "/v1/locks/acquire",
            OTHER,
            acquire_body(&s, "k2", 0),
        )
        .await;
        assert_problem(&r, 403, "forbidden");
    }
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k2", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(slots(&f).await, 1);
    let rel = json!({ "session": s, "namespace": "ns", "class": "c", "key": "k2",
                      "mode": "exclusive", "grant_rev": r.body["grant_rev"] });
    let r = call(b, "POST", "/v1/locks/release", OWNER, rel.clone()).await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(slots(&f).await, 0, "the release through B freed A's slot");
    let r = call(a, "POST", "/v1/locks/release", OWNER, rel).await;
    assert_problem(&r, 409, "not-held");
    // Closed through B: A, which cached the session, answers as if it never had.
    let r = call(
        b,
        "DELETE",
        &format!("/v1/sessions/{s}"),
        OWNER,
        Value::Null,
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k3", 0),
    )
    .await;
    assert_problem(&r, 404, "not-found");
    assert_eq!(slots(&f).await, 0);
}

/// One acquire and release of `key` through the service, both answered with success.
async fn cycle(addr: SocketAddr, session: &str, key: &str) {
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(session, key, 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let rel = json!({ "session": session, "namespace": "ns", "class": "c", "key": key,
                      "mode": "exclusive", "grant_rev": r.body["grant_rev"] });
    let r = call(addr, "POST", "/v1/locks/release", OWNER, rel).await;
    assert_eq!(r.status, 204, "{:?}", r.body);
}

/// The service reads a namespace's record (its quotas) and a session's record from etcd
/// once, not on every call: a cycle is two Txns. An update of the namespace written
/// through another locker reaches it (the record is cached with the classes, under the
/// same watch on the config prefix).
#[tokio::test]
async fn etcd_namespace_and_session_records_are_cached_and_an_update_reaches_the_service() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let s = open(addr, OWNER, 10_000).await;
    cycle(addr, &s, "warm").await;
    let calls = |method: &'static str| {
        let label = format!("grpc_method=\"{method}\"");
        let cluster = &f.cluster;
        async move { cluster.metric(0, "grpc_server_handled_total", &label).await }
    };
    let (ranges, txns) = (calls("Range").await, calls("Txn").await);
    for i in 0..10 {
        cycle(addr, &s, &format!("c{i}")).await;
    }
    // Per cycle: the acquire's Txn (which also takes the quota slot and checks the
    // session record's revision) and the release's (which frees the slot). No read: the
    // namespace record, the class and the session record are cached, and the slot is
    // known to the replica that took it.
    let per_cycle = (calls("Range").await - ranges) / 10.0;
    assert_eq!(per_cycle, 0.0, "{per_cycle} Range calls per cycle");
    let per_cycle = (calls("Txn").await - txns) / 10.0;
    assert_eq!(per_cycle, 2.0, "{per_cycle} Txn calls per cycle");

    // A quota of one slot, written through another locker: the replica enforces it.
    let held = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "q0", 1_000),
    )
    .await;
    assert_eq!(held.status, 200, "{:?}", held.body);
    let mut ns = Namespace::new("ns", "tenant");
    ns.held_lease_quota = 1;
    f.locker.config().put_namespace(&ns).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut n = 0;
    loop {
        let r = call(
            addr,
            "POST",
            "/v1/locks/acquire",
            OWNER,
            acquire_body(&s, &format!("q{}", n + 1), 200),
        )
        .await;
        if r.status == 429 {
            assert!(
                r.body["detail"]
                    .as_str()
                    .unwrap()
                    .contains("held_lease_quota"),
                "{:?}",
                r.body
            );
            break;
        }
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert!(
            tokio::time::Instant::now() < until,
            "the quota of one never reached the service"
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn etcd_op_rate_quota_is_a_token_bucket_with_retry_after() {
    const RATE: u32 = 3;
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let mut ns = Namespace::new("ns", "tenant");
    ns.op_rate_quota = RATE;
    f.locker.config().put_namespace(&ns).await.unwrap();
    let status = "/v1/locks/status?namespace=ns&class=c&key=k";

    // A burst of 12 calls: the bucket admits RATE, plus what refilled meanwhile.
    let start = tokio::time::Instant::now();
    let mut admitted = 0u32;
    let mut refused = None;
    for _ in 0..12 {
        let r = call(addr, "GET", status, OWNER, Value::Null).await;
        if r.status == 200 {
            admitted += 1;
        } else {
            assert_problem(&r, 429, "quota-exceeded");
            assert!(
                r.body["detail"].as_str().unwrap().contains("op_rate_quota"),
                "{:?}",
                r.body
            );
            assert_eq!(
                r.retry_after,
                Some(1),
                "one token refills in 1/{RATE} s, rounded up"
            );
            refused = Some(r);
        }
    }
    let refill = u32::try_from(start.elapsed().as_millis() * u128::from(RATE) / 1000).unwrap() + 1;
    assert!(refused.is_some());
    assert!(
        admitted >= RATE && admitted <= RATE + refill,
        "admitted {admitted}"
    );
    // Other kinds of operation draw from the same bucket.
    let s = open(addr, OWNER, 5_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 500),
    )
    .await;
    assert_problem(&r, 429, "quota-exceeded");
    assert_eq!(slots(&f).await, 0, "a refused acquire takes no quota slot");
    // After Retry-After the bucket has refilled.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 500),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // The replica's metrics count what happened above.
    let r = call(addr, "GET", "/metrics", OWNER, Value::Null).await;
    assert_eq!(r.status, 200);
    let text = r.body.as_str().unwrap();
    let value = |series: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
            .parse()
            .unwrap()
    };
    let refused = u64::from(12 - admitted) + 1;
    assert_eq!(
        value("palisade_quota_rejections_total{quota=\"op_rate_quota\"}"),
        refused
    );
    assert_eq!(value("palisade_grants_total"), 1);
    assert_eq!(value("palisade_acquire_wait_seconds_count"), 1);
    assert_eq!(value("palisade_etcd_errors_total"), 0);
}
