//! The write-event sink on real Postgres: fields, spool while down, drain once, shutdown,
//! overload.

use std::path::Path;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::routing::put;
use axum::Router;
use http::{Method, Request, StatusCode};
use palisade_audit::{
    insert_writes, AuditSink, CallerIdentity, Finding, Labels, Outcome, PeerSpiffeId, WriteRecord,
};
use palisade_fence::{Enforcement, EnforcementTable, FenceLayer, FencingToken, MemoryStore};
use tower::{Layer, Service, ServiceExt};

use crate::common::{admin, bring_up, count, eventually, migrated_db, request, take_down};

/// A service whose `/legacy/` resources are advisory and the rest fenced, reporting every
/// write to `sink`, naming callers by mTLS peer or the trusted proxy's XFCC header.
fn app(sink: &AuditSink) -> Router {
    let layer = FenceLayer::new(MemoryStore::new(10_000))
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced)
                .with_prefix("/legacy/", Enforcement::Advisory),
        )
        .with_fenced_events()
        .with_observer(sink.observer())
        .with_caller(
            CallerIdentity::new()
                .trust_proxy_spiffe_id("spiffe://td/envoy")
                .into_fn(),
        );
    Router::new()
        .route("/{*path}", put(|| async { "ok" }))
        .layer(layer)
        .layer(axum::middleware::map_request(
            |mut req: Request<Body>| async move {
                // Stands in for the TLS acceptor: the peer named in a test-only header.
                if let Some(peer) = req
                    .headers()
                    .get("x-test-peer")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                {
                    req.extensions_mut().insert(PeerSpiffeId::new(peer));
                }
                req
            },
        ))
}

fn classify(resource: &str) -> Labels {
    if resource == "/legacy/other" {
        // Postgres text cannot hold NUL: the sink replaces it rather than fail the batch.
        Labels::new("shop", "leg\0acy")
    } else if resource.starts_with("/legacy/") {
        Labels::new("shop", "legacy")
    } else {
        Labels::new("shop", "orders")
    }
}

fn spool_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn events_land_with_the_right_fields() {
    let (_db, pool) = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = AuditSink::builder("orders-api", dir.path().join("spool.jsonl"))
        .classify(classify)
        .start(pool.clone());
    let app = app(&sink);
    let before = SystemTime::now();
    let t = FencingToken::from_u64(1000).unwrap();
    let ts = t.to_string();
    let xfcc = "By=spiffe://td/orders-api;Hash=ab;URI=spiffe://td/billing";
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16);
    let cases: [Case<'_>; 5] = [
        (
            "/orders/1",
            vec![
                ("fencing-token", ts.as_str()),
                ("x-test-peer", "spiffe://td/writer"),
            ],
            200,
        ),
        (
            "/orders/1",
            vec![
                ("fencing-token", "999"),
                ("x-test-peer", "spiffe://td/late"),
            ],
            409,
        ),
        (
            "/legacy/report",
            vec![
                ("x-test-peer", "spiffe://td/envoy"),
                ("x-forwarded-client-cert", xfcc),
            ],
            200,
        ),
        // XFCC from someone who is not the proxy: ignored, the peer is the caller.
        (
            "/legacy/report",
            vec![
                ("x-test-peer", "spiffe://td/mallory"),
                ("x-forwarded-client-cert", xfcc),
            ],
            200,
        ),
        ("/legacy/other", vec![], 200),
    ];
    for (path, headers, status) in &cases {
        let r = request(&app, Method::PUT, path, headers).await;
        assert_eq!(r.status.as_u16(), *status, "{path}");
    }
    let stats = sink.shutdown().await;
    assert_eq!(
        (stats.inserted, stats.spooled, stats.dropped, stats.lost),
        (5, 0, 0, 0)
    );
    let client = pool.get().await.unwrap();
    let rows = client
        .query(
            "SELECT service, resource, method, token, outcome, finding, enforcement, namespace, class, caller, at, highest \
             FROM write_event ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    type Row = (
        String,
        String,
        String,
        Option<i64>,
        String,
        String,
        String,
        String,
        String,
        Option<String>,
        Option<i64>,
    );
    let got: Vec<Row> = rows
        .iter()
        .map(|r| {
            let at: SystemTime = r.get(10);
            assert!(at >= before - Duration::from_millis(1) && at <= SystemTime::now());
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
                r.get(7),
                r.get(8),
                r.get(9),
                r.get(11),
            )
        })
        .collect();
    let s = |v: &str| v.to_owned();
    let expected: Vec<Row> = vec![
        (
            s("orders-api"),
            s("/orders/1"),
            s("PUT"),
            Some(1000),
            s("admitted"),
            s("current"),
            s("fenced"),
            s("shop"),
            s("orders"),
            Some(s("spiffe://td/writer")),
            None,
        ),
        (
            s("orders-api"),
            s("/orders/1"),
            s("PUT"),
            Some(999),
            s("rejected"),
            s("stale"),
            s("fenced"),
            s("shop"),
            s("orders"),
            Some(s("spiffe://td/late")),
            Some(1000),
        ),
        (
            s("orders-api"),
            s("/legacy/report"),
            s("PUT"),
            None,
            s("unprotected"),
            s("missing_token"),
            s("advisory"),
            s("shop"),
            s("legacy"),
            Some(s("spiffe://td/billing")),
            None,
        ),
        (
            s("orders-api"),
            s("/legacy/report"),
            s("PUT"),
            None,
            s("unprotected"),
            s("missing_token"),
            s("advisory"),
            s("shop"),
            s("legacy"),
            Some(s("spiffe://td/mallory")),
            None,
        ),
        (
            s("orders-api"),
            s("/legacy/other"),
            s("PUT"),
            None,
            s("unprotected"),
            s("missing_token"),
            s("advisory"),
            s("shop"),
            s("leg\u{fffd}acy"),
            None,
            None,
        ),
    ];
    assert_eq!(got, expected, "rows in id (= arrival) order");
}

#[tokio::test]
async fn database_down_spools_and_the_spool_drains_exactly_once() {
    let (db, pool) = migrated_db().await;
    let admin = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool.jsonl");
    let sink = AuditSink::builder("svc", &spool)
        .flush_interval(Duration::from_millis(20))
        .retry_interval(Duration::from_millis(200))
        .db_timeout(Duration::from_secs(2))
        .start(pool.clone());
    let app = app(&sink);
    let watcher = palisade_audit::pool(&db.connection_string(), 1).unwrap();
    let rows = || {
        let watcher = watcher.clone();
        async move {
            match watcher.get().await {
                Ok(c) => count(&c, "SELECT count(*) FROM write_event").await,
                Err(_) => -1,
            }
        }
    };
    for i in 0..20 {
        request(&app, Method::PUT, &format!("/legacy/up/{i}"), &[]).await;
    }
    eventually("20 rows while up", || async { rows().await == 20 }).await;

    take_down(&admin, &db).await;
    for i in 0..30 {
        request(&app, Method::PUT, &format!("/legacy/down/{i}"), &[]).await;
    }
    // The counter moves once the append is synced.
    eventually("30 spooled lines", || async {
        spool_lines(&spool) == 30 && sink.stats().spooled == 30
    })
    .await;
    assert_eq!(sink.stats().inserted, 20);

    bring_up(&admin, &db).await;
    eventually("the spool drained", || async {
        rows().await == 50 && spool_lines(&spool) == 0
    })
    .await;
    for i in 0..10 {
        request(&app, Method::PUT, &format!("/legacy/after/{i}"), &[]).await;
    }
    let stats = sink.shutdown().await;
    assert_eq!(
        (
            stats.inserted,
            stats.spooled,
            stats.drained,
            stats.dropped,
            stats.lost
        ),
        (30, 30, 30, 0, 0)
    );
    let client = pool.get().await.unwrap();
    assert_eq!(count(&client, "SELECT count(*) FROM write_event").await, 60);
    assert_eq!(
        count(&client, "SELECT count(DISTINCT resource) FROM write_event").await,
        60,
        "each event once"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM write_event WHERE resource LIKE '/legacy/down/%'"
        )
        .await,
        30
    );
    assert_eq!(std::fs::metadata(&spool).unwrap().len(), 0);
}

#[tokio::test]
async fn a_replay_after_a_partial_drain_duplicates_nothing() {
    let (_db, pool) = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool.jsonl");
    let records: Vec<WriteRecord> = (0..10)
        .map(|i| {
            WriteRecord::new(
                "svc",
                format!("/r/{i}"),
                "PUT",
                Outcome::Unprotected,
                Finding::MissingToken,
                SystemTime::now(),
            )
        })
        .collect();
    // As left by a crash: all ten spooled, the first six already inserted, a torn line.
    let mut text: String = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    text.push_str("{\"id\":\"01");
    std::fs::write(&spool, text).unwrap();
    let client = pool.get().await.unwrap();
    insert_writes(&**client, &records[..6]).await.unwrap();
    let sink = AuditSink::builder("svc", &spool)
        .flush_interval(Duration::from_millis(20))
        .start(pool.clone());
    eventually("the spool drained", || async { spool_lines(&spool) == 0 }).await;
    let stats = sink.shutdown().await;
    assert_eq!((stats.drained, stats.spool_skipped), (10, 1));
    assert_eq!(count(&client, "SELECT count(*) FROM write_event").await, 10);
    let ids: Vec<uuid::Uuid> = client
        .query("SELECT id FROM write_event ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut expected: Vec<_> = records.iter().map(|r| r.id).collect();
    expected.sort();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn shutdown_flushes_everything_to_postgres_or_else_to_the_spool() {
    let (db, pool) = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool.jsonl");
    // A long flush interval: only shutdown writes these.
    let slow = |pool| {
        AuditSink::builder("svc", &spool)
            .batch_size(10_000)
            .flush_interval(Duration::from_secs(3600))
            .start(pool)
    };
    let sink = slow(pool.clone());
    let app = app(&sink);
    for i in 0..300 {
        request(&app, Method::PUT, &format!("/legacy/{i}"), &[]).await;
    }
    let stats = sink.shutdown().await;
    assert_eq!((stats.inserted, stats.spooled), (300, 0));
    let client = pool.get().await.unwrap();
    assert_eq!(
        count(&client, "SELECT count(*) FROM write_event").await,
        300
    );
    drop(client);

    // Down at shutdown: everything goes to the spool, and the next sink replays it.
    let admin = admin().await;
    let sink = slow(pool.clone());
    let app = self::app(&sink);
    for i in 0..200 {
        request(&app, Method::PUT, &format!("/legacy/later/{i}"), &[]).await;
    }
    take_down(&admin, &db).await;
    let stats = sink.shutdown().await;
    assert_eq!((stats.inserted, stats.spooled), (0, 200));
    assert_eq!(spool_lines(&spool), 200);
    bring_up(&admin, &db).await;
    let sink = AuditSink::builder("svc", &spool)
        .flush_interval(Duration::from_millis(20))
        .start(pool.clone());
    eventually("the spool drained", || async { spool_lines(&spool) == 0 }).await;
    assert_eq!(sink.shutdown().await.drained, 200);
    let client = pool.get().await.unwrap();
    assert_eq!(
        count(&client, "SELECT count(*) FROM write_event").await,
        500
    );
}

/// Current-thread runtime and no await between the writes: the worker cannot run, so the
/// queue holds exactly `capacity` events and the rest are dropped.
#[tokio::test(flavor = "current_thread")]
async fn overload_drops_are_counted_and_recorded_as_an_event() {
    let (_db, pool) = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = AuditSink::builder("svc", dir.path().join("spool.jsonl"))
        .capacity(8)
        .start(pool.clone());
    let layer = FenceLayer::new(MemoryStore::new(100))
        .with_enforcement(|_| Enforcement::Advisory)
        .with_observer(sink.observer());
    let mut svc = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    let mut pending = Vec::new();
    svc.ready().await.unwrap();
    for i in 0..100 {
        // The layer reports a write without a token from `call` itself.
        let req = Request::builder()
            .method(Method::PUT)
            .uri(format!("/r/{i}"))
            .body(Body::empty())
            .unwrap();
        pending.push(svc.call(req));
    }
    assert_eq!(sink.stats().dropped, 92);
    for f in pending {
        assert_eq!(f.await.unwrap().status(), StatusCode::OK);
    }
    let stats = sink.shutdown().await;
    assert_eq!(
        (stats.dropped, stats.inserted),
        (92, 9),
        "8 events and one dropped row"
    );
    let client = pool.get().await.unwrap();
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM write_event WHERE outcome = 'unprotected'"
        )
        .await,
        8
    );
    let dropped: Vec<(i64, Option<String>)> = client
        .query(
            "SELECT dropped, resource FROM write_event WHERE outcome = 'dropped'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(dropped, [(92, None)]);
    // The first eight were kept, in order.
    let kept: Vec<String> = client
        .query(
            "SELECT resource FROM write_event WHERE outcome = 'unprotected' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept, (0..8).map(|i| format!("/r/{i}")).collect::<Vec<_>>());
}
