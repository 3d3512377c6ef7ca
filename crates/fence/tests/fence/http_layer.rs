//! The tower layers over real HTTP on loopback (axum server, hyper client).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap as AxumHeaders;
use axum::routing::{get, put};
use axum::{Extension, Router};
use http::{HeaderValue, Method, StatusCode};
use palisade_fence::{
    ChannelObserver, Enforcement, EnforcementTable, FenceLayer, FencingToken, FencingTokenLayer,
    MemoryStore, PostgresStore, Rejection, RejectionKind, VerifiedToken, WriteOutcome,
};
use tower::ServiceBuilder;

use crate::common::{client, send, serve, tok, Reply};
use crate::postgres_helper::fresh_db;

/// A handler that counts its calls and echoes the verified token, if any.
fn echo_app(calls: Arc<AtomicUsize>) -> Router {
    echo_route(calls, "/{*path}")
}

fn echo_route(calls: Arc<AtomicUsize>, path: &str) -> Router {
    let write = move |verified: Option<Extension<VerifiedToken>>| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            match verified {
                Some(Extension(v)) => format!("{} {}", v.token, v.resource),
                None => "unverified".to_owned(),
            }
        }
    };
    Router::new().route(
        path,
        put(write.clone())
            .post(write.clone())
            .patch(write.clone())
            .delete(write.clone())
            .get(write),
    )
}

fn assert_problem(
    reply: &Reply,
    status: u16,
    kind: &str,
    resource: &str,
    token: Option<FencingToken>,
    highest: Option<FencingToken>,
) {
    assert_eq!(reply.status.as_u16(), status);
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    let doc = reply.json();
    assert_eq!(doc["status"], status, "{doc}");
    assert_eq!(doc["type"], format!("urn:palisade:problem:{kind}"), "{doc}");
    assert!(
        doc["title"].as_str().is_some_and(|t| !t.is_empty()),
        "{doc}"
    );
    assert!(
        doc["detail"].as_str().is_some_and(|t| !t.is_empty()),
        "{doc}"
    );
    assert_eq!(doc["resource"], resource, "{doc}");
    match token {
        Some(t) => assert_eq!(doc["token"], t.to_string(), "{doc}"),
        None => assert!(doc.get("token").is_none(), "{doc}"),
    }
    match highest {
        Some(h) => assert_eq!(doc["highest"], h.to_string(), "{doc}"),
        None => assert!(doc.get("highest").is_none(), "{doc}"),
    }
}

#[tokio::test]
async fn fenced_writes_get_428_400_409_as_problem_json_and_never_reach_the_handler() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = echo_app(Arc::clone(&calls)).layer(FenceLayer::new(MemoryStore::new(1_000)));
    let addr = serve(app).await;
    let c = client();
    let t10 = tok(10).to_string();
    let t5 = tok(5).to_string();

    let r = send(&c, Method::PUT, addr, "/orders/1", &[]).await;
    assert_problem(&r, 428, "missing-token", "/orders/1", None, None);
    for bad in ["12a", "+5", "-1", "1 2", "9223372036854775808"] {
        let r = send(&c, Method::PUT, addr, "/orders/1", &[bad]).await;
        assert_problem(&r, 400, "malformed-token", "/orders/1", None, None);
    }
    let r = send(&c, Method::PUT, addr, "/orders/1", &[&t10, &t10]).await;
    assert_problem(&r, 400, "malformed-token", "/orders/1", None, None);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "no refused request reached the handler"
    );

    let r = send(&c, Method::PUT, addr, "/orders/1", &[&t10]).await;
    assert_eq!(
        (r.status, r.text()),
        (StatusCode::OK, format!("{} /orders/1", tok(10)))
    );
    let r = send(&c, Method::POST, addr, "/orders/1", &[&t5]).await;
    assert_problem(
        &r,
        409,
        "stale-token",
        "/orders/1",
        Some(tok(5)),
        Some(tok(10)),
    );
    let r = send(
        &c,
        Method::DELETE,
        addr,
        "/orders/1",
        &[&format!(" {t10}\t")],
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "an equal token, with optional whitespace, is admitted"
    );
    let r = send(&c, Method::PUT, addr, "/orders/2", &[&t5]).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "marks are per resource (the path)"
    );
    let r = send(&c, Method::GET, addr, "/orders/1", &[]).await;
    assert_eq!(
        (r.status, r.text()),
        (StatusCode::OK, "unverified".to_owned()),
        "reads are not checked"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn the_store_being_down_is_a_503_when_fenced() {
    let (db, admin) = fresh_db().await;
    let conn = db.connect().await;
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let calls = Arc::new(AtomicUsize::new(0));
    let (observer, mut events) = ChannelObserver::bounded(8);
    let layer = FenceLayer::new(PostgresStore::new(Arc::new(conn)))
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced).with_prefix("/adv/", Enforcement::Advisory),
        )
        .with_observer(observer);
    let addr = serve(echo_app(Arc::clone(&calls)).layer(layer)).await;
    admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let c = client();
    let r = send(&c, Method::PUT, addr, "/x", &[&tok(3).to_string()]).await;
    assert_problem(&r, 503, "store-unavailable", "/x", Some(tok(3)), None);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let r = send(&c, Method::PUT, addr, "/adv/x", &[&tok(3).to_string()]).await;
    assert_eq!(r.status, StatusCode::OK);
    let e = events.try_recv().unwrap();
    assert_eq!(
        (e.outcome, e.unprotected, e.token),
        (WriteOutcome::StoreUnavailable, true, Some(tok(3)))
    );
}

/// A path with a NUL byte (`%00`), which Postgres `text` cannot hold, is fenced like any
/// other: its mark is kept under U+FFFD, shared with the name spelled so. (It was a 503
/// "retry" for every such request: the database refused the name.)
#[tokio::test]
async fn a_nul_in_the_path_is_fenced_through_postgres_not_a_503() {
    let (db, _admin) = fresh_db().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let store = PostgresStore::new(Arc::new(db.connect().await));
    let layer = FenceLayer::new(store.clone());
    let addr = serve(echo_app(Arc::clone(&calls)).layer(layer)).await;
    let c = client();
    let r = send(
        &c,
        Method::PUT,
        addr,
        "/orders/a%00b",
        &[&tok(5).to_string()],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // The same name, and the one spelled with U+FFFD: one mark.
    for (path, resource) in [
        ("/orders/a%00b", "/orders/a\0b"),
        ("/orders/a%EF%BF%BDb", "/orders/a\u{FFFD}b"),
    ] {
        let r = send(&c, Method::PUT, addr, path, &[&tok(4).to_string()]).await;
        assert_problem(&r, 409, "stale-token", resource, Some(tok(4)), Some(tok(5)));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let mark = store.mark("/orders/a\0b").await.unwrap().unwrap();
    assert_eq!(mark.token, tok(5));
}

/// An empty `Fencing-Token` value (or one of only whitespace, which HTTP trims) carries
/// no token: a missing token, not a malformed one.
#[tokio::test]
async fn an_empty_header_is_a_missing_token_428_when_fenced_and_reported_when_advisory() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (observer, mut events) = ChannelObserver::bounded(64);
    let layer = FenceLayer::new(MemoryStore::new(1_000))
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced)
                .with_prefix("/legacy/", Enforcement::Advisory),
        )
        .with_observer(observer);
    let addr = serve(echo_app(Arc::clone(&calls)).layer(layer)).await;
    let c = client();
    for empty in ["", " ", "\t "] {
        let r = send(&c, Method::PUT, addr, "/orders/1", &[empty]).await;
        assert_problem(&r, 428, "missing-token", "/orders/1", None, None);

        let r = send(&c, Method::PUT, addr, "/legacy/report", &[empty]).await;
        assert_eq!(r.status, StatusCode::OK);
        let e = events.try_recv().expect("one event per advisory write");
        assert_eq!(
            (e.outcome, e.unprotected, e.token),
            (WriteOutcome::MissingToken, true, None)
        );
    }
    // An empty value beside a token is still two values: malformed.
    let t = tok(3).to_string();
    let r = send(&c, Method::PUT, addr, "/orders/1", &["", &t]).await;
    assert_problem(&r, 400, "malformed-token", "/orders/1", None, None);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "only the advisory writes ran"
    );
}

#[tokio::test]
async fn advisory_resources_let_everything_through_and_report_each_write() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (observer, mut events) = ChannelObserver::bounded(64);
    let layer = FenceLayer::new(MemoryStore::new(1_000))
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced)
                .with_prefix("/legacy/", Enforcement::Advisory),
        )
        .with_observer(observer.clone());
    let addr = serve(echo_app(Arc::clone(&calls)).layer(layer)).await;
    let c = client();
    type Case<'a> = (
        &'a [&'a str],
        u16,
        WriteOutcome,
        Option<FencingToken>,
        Option<FencingToken>,
    );
    let cases: [Case<'_>; 4] = [
        (&[], 200, WriteOutcome::MissingToken, None, None),
        (&["x1"], 200, WriteOutcome::MalformedToken, None, None),
        (
            &["1000"],
            200,
            WriteOutcome::Admitted,
            Some(FencingToken::from_u64(1000).unwrap()),
            None,
        ),
        (
            &["999"],
            200,
            WriteOutcome::Stale,
            Some(FencingToken::from_u64(999).unwrap()),
            Some(FencingToken::from_u64(1000).unwrap()),
        ),
    ];
    for (headers, status, outcome, token, highest) in cases {
        let r = send(&c, Method::PATCH, addr, "/legacy/report", headers).await;
        assert_eq!(r.status.as_u16(), status);
        let e = events.try_recv().expect("one event per advisory write");
        assert_eq!(e.resource, "/legacy/report");
        assert_eq!(e.method, Method::PATCH);
        assert_eq!((e.outcome, e.token, e.highest), (outcome, token, highest));
        assert_eq!(e.unprotected, outcome != WriteOutcome::Admitted);
    }
    // The fenced part of the same service still refuses, and reports nothing.
    let r = send(&c, Method::PUT, addr, "/orders/1", &[]).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED);
    assert!(events.try_recv().is_err(), "no events for fenced resources");
    assert_eq!(observer.dropped(), 0);
}

/// The identity an outer layer (a TLS acceptor, say) put in the request's extensions.
#[derive(Clone)]
struct Peer(&'static str);

#[tokio::test]
async fn fenced_events_report_admitted_and_refused_writes_with_time_and_caller() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (observer, mut events) = ChannelObserver::bounded(64);
    let layer = FenceLayer::new(MemoryStore::new(1_000))
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced)
                .with_prefix("/legacy/", Enforcement::Advisory),
        )
        .with_observer(observer.clone())
        .with_fenced_events()
        .with_caller(|_, extensions| extensions.get::<Peer>().map(|p| p.0.to_owned()));
    let app = echo_app(Arc::clone(&calls)).layer(
        ServiceBuilder::new()
            .map_request(|mut req: http::Request<axum::body::Body>| {
                if req.uri().path().ends_with("/1") {
                    req.extensions_mut()
                        .insert(Peer("spiffe://example.org/writer"));
                }
                req
            })
            .layer(layer),
    );
    let addr = serve(app).await;
    let c = client();
    let before = std::time::SystemTime::now();
    // (path, token, status, outcome, enforcement, rejected, unprotected, caller)
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        u16,
        WriteOutcome,
        Enforcement,
        bool,
        bool,
        Option<&'a str>,
    );
    let cases: [Case<'_>; 5] = [
        (
            "/orders/1",
            &["1000"],
            200,
            WriteOutcome::Admitted,
            Enforcement::Fenced,
            false,
            false,
            Some("spiffe://example.org/writer"),
        ),
        (
            "/orders/1",
            &["999"],
            409,
            WriteOutcome::Stale,
            Enforcement::Fenced,
            true,
            false,
            Some("spiffe://example.org/writer"),
        ),
        (
            "/orders/2",
            &[],
            428,
            WriteOutcome::MissingToken,
            Enforcement::Fenced,
            true,
            false,
            None,
        ),
        (
            "/legacy/1",
            &[],
            200,
            WriteOutcome::MissingToken,
            Enforcement::Advisory,
            false,
            true,
            Some("spiffe://example.org/writer"),
        ),
        (
            "/legacy/2",
            &["1000"],
            200,
            WriteOutcome::Admitted,
            Enforcement::Advisory,
            false,
            false,
            None,
        ),
    ];
    for (path, tokens, status, outcome, enforcement, rejected, unprotected, caller) in cases {
        let r = send(&c, Method::PUT, addr, path, tokens).await;
        assert_eq!(r.status.as_u16(), status, "{path} {tokens:?}");
        let e = events.try_recv().expect("one event per checked write");
        assert_eq!(e.resource, path);
        assert_eq!(
            (e.outcome, e.enforcement, e.rejected, e.unprotected),
            (outcome, enforcement, rejected, unprotected),
            "{path} {tokens:?}"
        );
        assert_eq!(e.caller.as_deref(), caller);
        assert!(e.at >= before && e.at <= std::time::SystemTime::now());
    }
    // Reads are not checked, so not reported.
    send(&c, Method::GET, addr, "/orders/1", &[]).await;
    assert!(events.try_recv().is_err());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "three writes and the read reached the handler"
    );
}

#[tokio::test]
async fn the_observer_queue_is_bounded_and_counts_drops() {
    let (observer, mut events) = ChannelObserver::bounded(2);
    let layer = FenceLayer::new(MemoryStore::new(10))
        .with_enforcement(|_| Enforcement::Advisory)
        .with_observer(observer.clone());
    let addr = serve(echo_app(Arc::new(AtomicUsize::new(0))).layer(layer)).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(
            send(&c, Method::PUT, addr, "/r", &[]).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(observer.dropped(), 3, "5 writes, room for 2");
    assert!(events.try_recv().is_ok() && events.try_recv().is_ok() && events.try_recv().is_err());
}

#[tokio::test]
async fn configuration_methods_resource_keys_route_layer_and_service_builder() {
    let calls = Arc::new(AtomicUsize::new(0));
    // GET checked too; the resource is the tenant header plus the path; /health unchecked.
    let layer = FenceLayer::new(MemoryStore::new(100))
        .with_methods([Method::GET, Method::PUT])
        .with_resource(|_, uri, headers| {
            if uri.path() == "/health" {
                return None;
            }
            let tenant = headers.get("x-tenant")?.to_str().ok()?;
            Some(format!("{tenant}:{}", uri.path()))
        });
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .merge(echo_route(Arc::clone(&calls), "/a"))
        .route_layer(ServiceBuilder::new().layer(layer));
    let addr = serve(app).await;
    let c = client();
    assert_eq!(
        send(&c, Method::GET, addr, "/health", &[]).await.status,
        StatusCode::OK
    );
    let r = send(&c, Method::GET, addr, "/a", &[]).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "no tenant header: no resource, unchecked"
    );
    let req = |token: &str, tenant: &str, method: Method| {
        let c = c.clone();
        let (token, tenant) = (token.to_owned(), tenant.to_owned());
        async move {
            let req = http::Request::builder()
                .method(method)
                .uri(format!("http://{addr}/a"))
                .header("fencing-token", token)
                .header("x-tenant", tenant)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let res = c.request(req).await.unwrap();
            let status = res.status();
            let body = http_body_util::BodyExt::collect(res.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    assert_eq!(
        req("7", "t1", Method::GET).await,
        (StatusCode::OK, "7 t1:/a".to_owned())
    );
    assert_eq!(
        req("6", "t1", Method::GET).await.0,
        StatusCode::CONFLICT,
        "GET is checked now"
    );
    assert_eq!(
        req("6", "t2", Method::PUT).await.0,
        StatusCode::OK,
        "another tenant, another mark"
    );
    assert_eq!(
        req("1", "t1", Method::POST).await.0,
        StatusCode::OK,
        "POST is no longer checked"
    );
    assert_eq!(req("x", "t1", Method::PUT).await.0, StatusCode::BAD_REQUEST);
    // route_layer: the layer runs only for matched routes, so an unknown one is a 404.
    let nope = http::Request::put(format!("http://{addr}/nope"))
        .header("x-tenant", "t1")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(
        c.request(nope).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_custom_rejection_response_replaces_the_problem_document() {
    let layer = FenceLayer::new(MemoryStore::new(10)).with_rejection_response(|r: &Rejection| {
        let body = format!(
            "{{\"error\":\"{:?}\",\"mark\":{:?}}}",
            r.kind,
            r.highest.map(|h| h.get())
        );
        let mut res = http::Response::new(bytes::Bytes::from(body));
        *res.status_mut() = if r.kind == RejectionKind::StaleToken {
            StatusCode::GONE
        } else {
            r.kind.status()
        };
        res
    });
    let addr = serve(echo_app(Arc::new(AtomicUsize::new(0))).layer(layer)).await;
    let c = client();
    assert_eq!(
        send(&c, Method::PUT, addr, "/r", &["9"]).await.status,
        StatusCode::OK
    );
    let r = send(&c, Method::PUT, addr, "/r", &["8"]).await;
    assert_eq!(
        (r.status, r.text()),
        (
            StatusCode::GONE,
            r#"{"error":"StaleToken","mark":Some(9)}"#.to_owned()
        )
    );
    assert_eq!(
        send(&c, Method::PUT, addr, "/r", &[]).await.status,
        StatusCode::PRECONDITION_REQUIRED
    );
}

#[tokio::test]
async fn the_rejection_rides_in_the_response_extensions() {
    use tower::{Service, ServiceExt};
    let inner = tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("inner")))
    });
    let mut svc = ServiceBuilder::new()
        .layer(FenceLayer::new(MemoryStore::new(10)))
        .service(inner);
    let req = http::Request::put("/r")
        .header("fencing-token", "9")
        .body(String::new())
        .unwrap();
    assert_eq!(
        svc.ready().await.unwrap().call(req).await.unwrap().status(),
        StatusCode::OK
    );
    let req = http::Request::put("/r")
        .header("fencing-token", "8")
        .body(String::new())
        .unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let rejection = res
        .extensions()
        .get::<Rejection>()
        .expect("rejection in extensions");
    assert_eq!(rejection.kind, RejectionKind::StaleToken);
    assert_eq!(
        (rejection.token, rejection.highest),
        (
            FencingToken::from_u64(8).ok(),
            FencingToken::from_u64(9).ok()
        )
    );
    assert_eq!(rejection.resource, "/r");
}

#[tokio::test]
async fn the_client_layer_stamps_the_token_from_its_source() {
    let seen = Arc::new(Mutex::new(Vec::<Option<String>>::new()));
    let log = Arc::clone(&seen);
    let app = Router::new()
        .route(
            "/w",
            put(move |headers: AxumHeaders| {
                let log = Arc::clone(&log);
                async move {
                    log.lock().unwrap().push(
                        headers
                            .get("fencing-token")
                            .map(|v| v.to_str().unwrap().to_owned()),
                    );
                    "ok"
                }
            }),
        )
        .layer(FenceLayer::new(MemoryStore::new(10)));
    let addr = serve(app).await;
    // The hold: a token that can be replaced or lost (0 = lost).
    let hold = Arc::new(AtomicU64::new(tok(42).get()));
    let source = Arc::clone(&hold);
    let stamped = ServiceBuilder::new()
        .layer(FencingTokenLayer::new(move || {
            FencingToken::from_u64(source.load(Ordering::SeqCst))
                .ok()
                .filter(|t| t.get() != 0)
        }))
        .service(client());
    let call = |caller_header: Option<&'static str>| {
        let mut s = stamped.clone();
        async move {
            use tower::{Service, ServiceExt};
            let mut req = http::Request::put(format!("http://{addr}/w"));
            if let Some(h) = caller_header {
                req = req.header("fencing-token", HeaderValue::from_static(h));
            }
            let req = req
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            s.ready().await.unwrap().call(req).await.unwrap().status()
        }
    };
    assert_eq!(call(None).await, StatusCode::OK);
    assert_eq!(
        call(Some("999999999999999")).await,
        StatusCode::OK,
        "a caller's header is replaced"
    );
    hold.store(tok(41).get(), Ordering::SeqCst);
    assert_eq!(
        call(None).await,
        StatusCode::CONFLICT,
        "an older hold is refused by the server"
    );
    hold.store(0, Ordering::SeqCst);
    assert_eq!(
        call(Some("5")).await,
        StatusCode::PRECONDITION_REQUIRED,
        "a lost hold sends no token"
    );
    let t = tok(42).to_string();
    assert_eq!(*seen.lock().unwrap(), vec![Some(t.clone()), Some(t)]);
}

/// Routers decode the path before extracting parameters: `/orders/%31` is served by the
/// handler of `/orders/1`. The default resource key must be the same for both, or a
/// stale writer could spell the path differently and slip past the mark.
#[tokio::test]
async fn a_percent_encoded_path_shares_the_mark_of_its_decoded_form() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_handler = Arc::clone(&seen);
    let counted = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/orders/{id}",
            put(
                move |axum::extract::Path(id): axum::extract::Path<String>,
                      Extension(v): Extension<VerifiedToken>| {
                    let (calls, seen) = (Arc::clone(&counted), Arc::clone(&seen_in_handler));
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        seen.lock().unwrap().push((id, v.resource));
                    }
                },
            ),
        )
        .route_layer(FenceLayer::new(MemoryStore::new(1_000)));
    let addr = serve(app).await;
    let c = client();

    let r = send(&c, Method::PUT, addr, "/orders/1", &[&tok(100).to_string()]).await;
    assert_eq!(r.status, StatusCode::OK);
    for alias in ["/orders/%31", "/orders/%31%"] {
        let r = send(&c, Method::PUT, addr, alias, &[&tok(5).to_string()]).await;
        if alias == "/orders/%31" {
            assert_problem(
                &r,
                409,
                "stale-token",
                "/orders/1",
                Some(tok(5)),
                Some(tok(100)),
            );
        } else {
            // A lone `%` decodes to itself: another resource, and a fresh mark.
            assert_eq!(r.status, StatusCode::OK, "{alias}");
        }
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            ("1".to_owned(), "/orders/1".to_owned()),
            ("1%".to_owned(), "/orders/1%".to_owned())
        ]
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the stale alias never reached the handler"
    );
}

/// `poll_ready` is the inner service's: a layer that answered ready on its own would let
/// callers push requests into a service that has no room for them.
#[tokio::test]
async fn readiness_and_its_errors_are_the_inner_services() {
    use std::task::Poll;
    use tower::{Layer, Service, ServiceExt};

    #[derive(Clone)]
    struct Gate(Arc<AtomicU64>);
    impl Service<http::Request<axum::body::Body>> for Gate {
        type Response = http::Response<axum::body::Body>;
        type Error = &'static str;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
        fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
            match self.0.load(Ordering::SeqCst) {
                0 => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                1 => Poll::Ready(Ok(())),
                _ => Poll::Ready(Err("inner service broke")),
            }
        }
        fn call(&mut self, _: http::Request<axum::body::Body>) -> Self::Future {
            std::future::ready(Ok(http::Response::new(axum::body::Body::empty())))
        }
    }

    let state = Arc::new(AtomicU64::new(0));
    let mut svc = FenceLayer::new(MemoryStore::new(10)).layer(Gate(Arc::clone(&state)));
    let not_ready = tokio::time::timeout(std::time::Duration::from_millis(50), svc.ready()).await;
    assert!(
        not_ready.is_err(),
        "the fence reported ready while the inner service was not"
    );
    state.store(1, Ordering::SeqCst);
    svc.ready().await.expect("ready once the inner service is");
    state.store(2, Ordering::SeqCst);
    assert_eq!(svc.ready().await.err(), Some("inner service broke"));
}
