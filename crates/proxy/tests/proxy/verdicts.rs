//! Verdicts as the fence layer gives them, through the proxy, to a Python upstream.

use http::Method;
use palisade_testkit::{PgBouncer, TestDb};

use crate::common::{admin, config, rows, send, start, Upstream, ORDERS};

#[tokio::test]
async fn a_stale_writer_is_refused_and_its_write_never_reaches_the_upstream() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;

    let first = send(proxy.addr, Method::PUT, "/orders/7", Some("200"), "new").await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        first.json()["fencing_token"],
        "200",
        "the token is passed on"
    );

    let stale = send(proxy.addr, Method::PUT, "/orders/7", Some("100"), "old").await;
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert_eq!(stale.headers["content-type"], "application/problem+json");
    let doc = stale.json();
    assert_eq!(doc["type"], "urn:palisade:problem:stale-token");
    assert_eq!(doc["resource"], "orders/7");
    assert_eq!(
        (doc["token"].as_str(), doc["highest"].as_str()),
        (Some("100"), Some("200"))
    );

    let missing = send(proxy.addr, Method::PUT, "/orders/7", None, "none").await;
    assert_eq!(missing.status, 428, "{}", missing.body);
    assert_eq!(missing.json()["type"], "urn:palisade:problem:missing-token");
    let malformed = send(proxy.addr, Method::POST, "/orders/7", Some("12abc"), "bad").await;
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    // Another order has its own mark; an equal token is current.
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/8", Some("100"), "x")
            .await
            .status,
        200
    );
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/7", Some("200"), "again")
            .await
            .status,
        200
    );
    // A read is not checked.
    assert_eq!(
        send(proxy.addr, Method::GET, "/headers", None, "")
            .await
            .status,
        200
    );

    assert_eq!(
        rows(&db).await,
        vec![
            ("7".into(), Some("200".into())),
            ("8".into(), Some("100".into())),
            ("7".into(), Some("200".into())),
        ],
        "only the admitted writes reached the upstream's table"
    );
}

#[tokio::test]
async fn another_spelling_of_a_fenced_path_is_still_fenced() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/7", Some("50"), "a")
            .await
            .status,
        200
    );
    for path in [
        "/orders//7",
        "/x/../orders/7",
        "/x/%2e%2e/orders/7",
        "/./orders/%37",
    ] {
        let r = send(proxy.addr, Method::PUT, path, Some("10"), "stale").await;
        assert_eq!(r.status, 409, "{path}: {}", r.body);
        assert_eq!(r.json()["resource"], "orders/7", "{path}");
    }
    for path in ["/../orders/7", "/orders%2F7", "/orders;v=1/7", "/orders\\7"] {
        let r = send(proxy.addr, Method::PUT, path, Some("60"), "x").await;
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert_eq!(r.json()["type"], "urn:palisade:problem:bad-path", "{path}");
    }
    // What reaches the upstream is the normalized path, so it routes as the proxy did.
    let r = send(proxy.addr, Method::PUT, "/x/../orders/7", Some("70"), "ok").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["id"], "7");
    assert_eq!(rows(&db).await.len(), 2);
}

#[tokio::test]
async fn two_replicas_on_one_postgres_one_behind_pgbouncer_give_the_same_verdicts() {
    let marks = TestDb::create().await;
    let mut owner = marks.connect().await;
    palisade_fence::migrate(&mut owner).await.unwrap();
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    // Replica a connects to PostgreSQL, replica b through PgBouncer in transaction mode.
    let bouncer = PgBouncer::start().await.unwrap();
    let store = |database: String| {
        format!("[store]\nkind = \"postgres\"\ndatabase = \"{database}\"\n{ORDERS}")
    };
    let a = start(config(&store(marks.connection_string()), &up.url())).await;
    let b = start(config(
        &store(bouncer.connection_string(marks.name())),
        &up.url(),
    ))
    .await;

    assert_eq!(
        send(a.addr, Method::PUT, "/orders/1", Some("300"), "a")
            .await
            .status,
        200
    );
    let refused = send(b.addr, Method::PUT, "/orders/1", Some("200"), "b").await;
    assert_eq!(
        refused.status, 409,
        "replica b knows replica a's mark: {}",
        refused.body
    );
    assert_eq!(refused.json()["highest"], "300");
    assert_eq!(
        send(b.addr, Method::PUT, "/orders/1", Some("400"), "b2")
            .await
            .status,
        200
    );
    let back = send(a.addr, Method::PUT, "/orders/1", Some("300"), "a2").await;
    assert_eq!(back.status, 409, "and a knows b's: {}", back.body);
    let mark: i64 = owner
        .query_one(
            "SELECT token FROM palisade_fence.fence_high_water WHERE resource = 'orders/1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark, 400);
    assert_eq!(
        rows(&db).await,
        vec![
            ("1".into(), Some("300".into())),
            ("1".into(), Some("400".into()))
        ]
    );
}

#[tokio::test]
async fn refused_and_unprotected_writes_reach_the_audit_trail() {
    let audit = TestDb::create().await;
    let pool = palisade_audit::pool(&audit.connection_string(), 2).unwrap();
    palisade_audit::migrate(&pool).await.unwrap();
    let spool = tempfile::tempdir().unwrap();
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let text = format!(
        "admin = \"127.0.0.1:0\"\n[audit]\ndatabase = \"{}\"\nspool = \"{}\"\nservice = \"orders-proxy\"\n{ORDERS}",
        audit.connection_string(),
        spool.path().join("audit.spool").display()
    );
    let proxy = start(config(&text, &up.url())).await;
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/1", Some("9"), "ok")
            .await
            .status,
        200
    );
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/1", Some("8"), "stale")
            .await
            .status,
        409
    );
    // Advisory: through without a token (the upstream has no /legacy, so 404 is its).
    assert_eq!(
        send(proxy.addr, Method::PUT, "/legacy/5", None, "x")
            .await
            .status,
        404
    );
    assert!(proxy.stop().await, "drained");
    let client = audit.connect().await;
    let found: Vec<(String, String, String, String)> = client
        .query(
            "SELECT service, resource, outcome, finding FROM write_event ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        found,
        vec![
            (
                "orders-proxy".into(),
                "orders/1".into(),
                "rejected".into(),
                "stale".into()
            ),
            (
                "orders-proxy".into(),
                "/legacy/5".into(),
                "unprotected".into(),
                "missing_token".into()
            ),
        ],
        "the admitted write is not an audit row; the refused and the unprotected are"
    );
}

#[tokio::test]
async fn metrics_count_by_route_pattern_never_by_raw_path() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(
        &format!("admin = \"127.0.0.1:0\"\n{ORDERS}"),
        &up.url(),
    ))
    .await;
    for i in 0..20 {
        let path = format!("/orders/{i}");
        assert_eq!(
            send(proxy.addr, Method::PUT, &path, Some("5"), "x")
                .await
                .status,
            200
        );
        assert_eq!(
            send(proxy.addr, Method::PUT, &path, Some("4"), "x")
                .await
                .status,
            409
        );
    }
    send(proxy.addr, Method::PUT, "/orders/1", None, "x").await;
    send(proxy.addr, Method::PUT, "/legacy/1", None, "x").await;
    send(proxy.addr, Method::GET, "/headers", None, "").await;
    let m = &proxy.metrics;
    assert_eq!(m.requests("/orders/{id}", "admitted"), 20);
    assert_eq!(m.requests("/orders/{id}", "refused_stale"), 20);
    assert_eq!(m.requests("/orders/{id}", "refused_missing_token"), 1);
    assert_eq!(m.requests("/legacy/{id}", "unprotected_missing_token"), 1);
    assert_eq!(m.requests("default", "unchecked"), 1);
    let (status, text) = admin(proxy.admin.unwrap(), "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        text.contains(
            "palisade_proxy_requests_total{route=\"/orders/{id}\",verdict=\"refused_stale\"} 20"
        ),
        "{text}"
    );
    assert!(
        !text.contains("/orders/1\""),
        "no raw path is a label: {text}"
    );
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("palisade_proxy_requests_total{"))
        .collect();
    for line in &series {
        let route = line.split('"').nth(1).unwrap();
        assert!(
            ["/orders/{id}", "/legacy/{id}", "default"].contains(&route),
            "a route label is a configured pattern: {line}"
        );
    }
    let counted = series.iter().filter(|l| !l.ends_with(" 0")).count();
    assert_eq!(counted, 5, "{text}");
    assert_eq!(admin(proxy.admin.unwrap(), "/livez").await.0, 200);
    let (ready, body) = admin(proxy.admin.unwrap(), "/readyz").await;
    assert_eq!((ready, body.as_str()), (200, "ready: memory store\n"));
}

#[tokio::test]
async fn readyz_says_when_the_postgres_store_does_not_answer() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    // A port nothing listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        "admin = \"127.0.0.1:0\"\n[store]\nkind = \"postgres\"\ndatabase = \"host=127.0.0.1 port={free} user=postgres connect_timeout=1\"\n{ORDERS}"
    );
    let proxy = start(config(&text, &up.url())).await;
    let (status, body) = admin(proxy.admin.unwrap(), "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("postgres store"), "{body}");
    // A fenced write cannot be checked: 503 from the layer, and nothing reaches the upstream.
    let r = send(proxy.addr, Method::PUT, "/orders/1", Some("5"), "x").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["type"], "urn:palisade:problem:store-unavailable");
    assert!(rows(&db).await.is_empty());
}

#[tokio::test]
async fn a_reload_swaps_routes_and_refuses_what_needs_a_restart() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let proxy = start(config(ORDERS, &up.url())).await;
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/1", None, "x")
            .await
            .status,
        428
    );
    let open = config("[default]\npolicy = \"open\"\n", &up.url());
    proxy.reloader.reload(open).unwrap();
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/1", None, "x")
            .await
            .status,
        200
    );
    let mut moved = config(ORDERS, &up.url());
    moved.listen = "127.0.0.1:1".parse().unwrap();
    let e = proxy.reloader.reload(moved).unwrap_err();
    assert_eq!(e.field, "listen");
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/1", None, "x")
            .await
            .status,
        200,
        "the refused reload changed nothing"
    );
}

#[tokio::test]
async fn methods_a_fenced_route_does_not_check_are_refused_not_passed() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let text = "[[route]]\npath = \"/orders/{id}\"\nmethods = [\"PUT\"]\nresource = \"orders/{id}\"\npolicy = \"fenced\"\n";
    let proxy = start(config(text, &up.url())).await;
    for method in ["put", "MOVE", "POST"] {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        let r = send(proxy.addr, m, "/orders/1", None, "x").await;
        assert_eq!(r.status, 405, "{method}: {}", r.body);
        assert_eq!(r.json()["type"], "urn:palisade:problem:method-not-checked");
    }
    // A method override would be obeyed by the framework after the check.
    let req = http::Request::get(format!("http://{}/orders/1", proxy.addr))
        .header("x-http-method-override", "PUT")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = crate::common::read(crate::common::client().request(req).await.unwrap()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["type"], "urn:palisade:problem:method-override");
    assert!(rows(&db).await.is_empty());
    assert_eq!(proxy.metrics.requests("/orders/{id}", "refused_method"), 3);
}

#[tokio::test]
async fn a_trailing_slash_names_the_same_resource() {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    // The one-command shape: every path fenced, the resource the decoded path.
    let proxy = start(config("", &up.url())).await;
    assert_eq!(
        send(proxy.addr, Method::PUT, "/orders/1", Some("7"), "a")
            .await
            .status,
        200
    );
    let r = send(proxy.addr, Method::PUT, "/orders/1/", Some("5"), "stale").await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.json()["resource"], "/orders/1");
}
