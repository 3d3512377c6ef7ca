//! The overview and the refused writes over a database filled with known rows, and the
//! refusals a real fence layer reports through the sink.

use std::time::{Duration, SystemTime};

use axum::routing::put;
use axum::Router;
use http::{Method, StatusCode};
use palisade_audit::{
    insert_lock_events, insert_writes, AuditSink, ClusterId, Finding, Labels, LockEvent, Outcome,
    WriteRecord,
};
use palisade_fence::{Enforcement, EnforcementTable, FenceLayer, MemoryStore, Revision};
use serde_json::Value;

use crate::common::{get, migrated_db, request};
use crate::dashboard::tok;

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn ago(now: SystemTime, secs: u64) -> SystemTime {
    now - Duration::from_secs(secs)
}

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// `n` writes of `outcome` / `finding` at `at`, by `caller` through `service` to `resource`.
#[allow(clippy::too_many_arguments)]
fn writes(
    n: usize,
    outcome: Outcome,
    finding: Finding,
    at: SystemTime,
    caller: &str,
    service: &str,
    resource: &str,
) -> Vec<WriteRecord> {
    (0..n)
        .map(|i| {
            let mut r = WriteRecord::new(
                service,
                resource,
                "PUT",
                outcome,
                finding,
                at - Duration::from_millis(i as u64),
            );
            r.caller = Some(caller.to_owned());
            r.labels = Labels::new("shop", "orders");
            if finding == Finding::Stale {
                r.token = Some(tok(5));
                r.highest = Some(tok(9));
            }
            r
        })
        .collect()
}

/// The rows behind the expected numbers of [`overview_numbers_are_the_databases`]; the
/// database is what the test compares against, so they are spelled out here.
pub(crate) async fn seed_overview(pool: &deadpool_postgres::Pool, now: SystemTime) {
    use Finding::*;
    use Outcome::*;
    let rows = [
        // The last 24 hours: 5 unprotected (3 by alice, 2 stale by bob).
        writes(
            3,
            Unprotected,
            MissingToken,
            ago(now, 1800),
            "spiffe://td/alice",
            "reports",
            "/legacy/report",
        ),
        writes(
            2,
            Unprotected,
            Stale,
            ago(now, 2 * HOUR),
            "spiffe://td/bob",
            "billing",
            "/legacy/ledger",
        ),
        // The last 7 days: 4 more by alice.
        writes(
            4,
            Unprotected,
            MalformedToken,
            ago(now, 3 * DAY),
            "spiffe://td/alice",
            "reports",
            "/legacy/old",
        ),
        // The week before: 5.
        writes(
            5,
            Unprotected,
            MissingToken,
            ago(now, 10 * DAY),
            "spiffe://td/carol",
            "reports",
            "/legacy/report",
        ),
        // Refused in the last hour: 2 stale, 1 missing, 1 malformed; one stale 3 days ago.
        writes(
            2,
            Rejected,
            Stale,
            ago(now, 600),
            "spiffe://td/worker",
            "orders-api",
            "/orders/42",
        ),
        writes(
            1,
            Rejected,
            MissingToken,
            ago(now, 700),
            "spiffe://td/worker",
            "orders-api",
            "/orders/43",
        ),
        writes(
            1,
            Rejected,
            MalformedToken,
            ago(now, 800),
            "spiffe://td/worker",
            "orders-api",
            "/orders/44",
        ),
        writes(
            1,
            Rejected,
            Stale,
            ago(now, 3 * DAY),
            "spiffe://td/worker",
            "orders-api",
            "/orders/42",
        ),
        // Admitted writes count nowhere.
        writes(
            6,
            Admitted,
            Current,
            ago(now, 900),
            "spiffe://td/worker",
            "orders-api",
            "/orders/42",
        ),
    ]
    .concat();
    let client = pool.get().await.unwrap();
    insert_writes(&**client, &rows).await.unwrap();
    let mut dropped = WriteRecord::dropped("reports", 7);
    dropped.at = ago(now, 60);
    let mut old_drop = WriteRecord::dropped("reports", 100);
    old_drop.at = ago(now, 2 * DAY);
    insert_writes(&**client, &[dropped, old_drop])
        .await
        .unwrap();
    let cluster = ClusterId(0x1234);
    insert_lock_events(
        &**client,
        &[
            LockEvent::gap(cluster, Revision::new(10), Revision::new(19)),
            LockEvent::gap(cluster, Revision::new(50), Revision::new(50)),
        ],
    )
    .await
    .unwrap();
}

fn tops(v: &Value, list: &str) -> Vec<(String, i64)> {
    v[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["count"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn overview_numbers_are_the_databases() {
    let (_db, pool) = migrated_db().await;
    let now = SystemTime::now();
    seed_overview(&pool, now).await;
    let app = palisade_audit::dashboard::router(pool);

    let day = json(&get(&app, "/api/overview").await.body);
    assert_eq!(day["unprotected"], 5, "{day}");
    assert_eq!(day["unprotected_24h"], 5);
    assert_eq!(day["unprotected_7d"], 9);
    assert_eq!(day["unprotected_prev_7d"], 5);
    assert_eq!(day["trend_7d_percent"], 80, "9 against 5");
    assert_eq!(
        day["refused"],
        serde_json::json!({"missing_token": 1, "malformed_token": 1, "stale": 2, "store_unavailable": 0})
    );
    assert_eq!(day["dropped"], 7);
    assert_eq!(
        (day["gaps"].as_i64(), day["gap_revisions"].as_i64()),
        (Some(2), Some(11))
    );
    assert_eq!(
        tops(&day, "top_callers"),
        [
            ("spiffe://td/alice".to_owned(), 3),
            ("spiffe://td/bob".to_owned(), 2)
        ]
    );
    assert_eq!(
        tops(&day, "top_services"),
        [("reports".to_owned(), 3), ("billing".to_owned(), 2)]
    );
    assert_eq!(
        tops(&day, "top_resources"),
        [
            ("/legacy/report".to_owned(), 3),
            ("/legacy/ledger".to_owned(), 2)
        ]
    );

    let week = json(&get(&app, "/api/overview?range=7d").await.body);
    assert_eq!(week["unprotected"], 9);
    assert_eq!(
        week["unprotected_24h"], 5,
        "the fixed tiles do not follow the range"
    );
    assert_eq!(week["dropped"], 107);
    assert_eq!(week["refused"]["stale"], 3);
    assert_eq!(
        tops(&week, "top_callers"),
        [
            ("spiffe://td/alice".to_owned(), 7),
            ("spiffe://td/bob".to_owned(), 2)
        ]
    );

    let page = get(&app, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.body;
    for needle in [
        "<strong id=\"unprotected-24h\">5</strong>",
        "Unprotected writes, last 7 days</div><div class=\"value\">9</div>",
        "<span class=\"up\" id=\"trend\">▲ 80%</span>",
        "<span class=\"reason\" id=\"refused-stale\">stale token: 2</span>",
        "Audit gaps (all time)</div><div class=\"value\">2</div>",
        "11 etcd revisions unread",
        "Dropped write events, in range</div><div class=\"value\">7</div>",
        "needs the dashboard started with etcd",
    ] {
        assert!(html.contains(needle), "{needle} not in {html}");
    }
    // Each top row links to its rows in the same window; the link finds exactly them.
    let link = html
        .split("href=\"")
        .map(|s| s.split('"').next().unwrap())
        .find(|h| h.starts_with("/unprotected?caller=spiffe%3A%2F%2Ftd%2Fbob&amp;from="))
        .expect("a link to bob's writes")
        .replace("&amp;", "&");
    let rows = json(
        &get(&app, &link.replacen("/unprotected", "/api/unprotected", 1))
            .await
            .body,
    );
    assert_eq!(rows["rows"].as_array().unwrap().len(), 2, "{link}");
    // The stacked chart: one segment per (hour, finding) with writes, 5 writes in all.
    let segments: i64 = html
        .split("class=\"seg seg-")
        .skip(1)
        .map(|s| {
            let n = s.split("data-count=\"").nth(1).unwrap();
            n[..n.find('"').unwrap()].parse::<i64>().unwrap()
        })
        .sum();
    assert_eq!(segments, 5);
    // The picker keeps the range on every navigation link.
    let week_page = get(&app, "/?range=7d").await.body;
    assert!(week_page.contains("<a href=\"/refused?range=7d\">Refused writes</a>"));
    assert!(week_page.contains("<strong class=\"range\">7d</strong>"));
}

#[tokio::test]
async fn refused_writes_page_and_json_show_reason_token_and_mark() {
    let (_db, pool) = migrated_db().await;
    let now = SystemTime::now();
    seed_overview(&pool, now).await;
    let app = palisade_audit::dashboard::router(pool);
    let all = json(&get(&app, "/api/refused").await.body);
    let rows = all["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "every refused write, nothing else");
    assert_eq!(rows[0]["finding"], "stale");
    assert_eq!(rows[0]["token"], tok(5).to_string());
    assert_eq!(rows[0]["highest"], tok(9).to_string());
    let day = json(&get(&app, "/api/refused?range=24h&finding=stale").await.body);
    assert_eq!(day["rows"].as_array().unwrap().len(), 2);
    let html = get(&app, "/refused?range=24h").await.body;
    assert_eq!(
        html.matches("<td class=\"reason\">409 stale token</td>")
            .count(),
        2
    );
    assert_eq!(
        html.matches("<td class=\"reason\">428 missing token</td>")
            .count(),
        1
    );
    assert!(html.contains(&tok(9).to_string()), "the mark is shown");
    for (uri, field) in [
        ("/api/refused?range=2d", "range: not one of"),
        ("/refused?finding=current", "finding: not one of"),
        ("/?range=1y", "range: not one of"),
    ] {
        let r = get(&app, uri).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{uri}");
        assert!(r.body.contains(field), "{uri}: {}", r.body);
    }
}

#[tokio::test]
async fn a_fence_layer_with_refused_events_stores_each_refusal_through_the_sink() {
    let (_db, pool) = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = AuditSink::builder("orders-api", dir.path().join("spool.jsonl"))
        .flush_interval(Duration::from_millis(20))
        .classify(|_| Labels::new("orders", "invoices"))
        .start(pool.clone());
    let layer = FenceLayer::new(MemoryStore::new(1_000))
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced)
                .with_prefix("/legacy/", Enforcement::Advisory),
        )
        .with_observer(sink.observer())
        .with_refused_events();
    let service = Router::new()
        .route("/{*path}", put(|| async { "ok" }))
        .layer(layer);
    let (t5, t7) = (tok(5).to_string(), tok(7).to_string());
    let sends: [(&str, Option<&str>, u16); 5] = [
        ("/orders/invoice-42", Some(&t7), 200),
        ("/orders/invoice-42", Some(&t5), 409),
        ("/orders/invoice-42", Some(&t5), 409),
        ("/orders/invoice-42", None, 428),
        ("/legacy/report", None, 200),
    ];
    for (path, token, status) in sends {
        let headers: Vec<(&str, &str)> = token.map(|t| ("fencing-token", t)).into_iter().collect();
        let r = request(&service, Method::PUT, path, &headers).await;
        assert_eq!(r.status.as_u16(), status, "{path}");
    }
    let stats = sink.shutdown().await;
    assert_eq!((stats.inserted, stats.dropped), (4, 0), "{stats:?}");

    let app = palisade_audit::dashboard::router(pool);
    let refused = json(&get(&app, "/api/refused").await.body);
    let got: Vec<(&str, Option<&str>, Option<&str>)> = refused["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["finding"].as_str().unwrap(),
                r["token"].as_str(),
                r["highest"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("missing_token", None, None),
            ("stale", Some(&*t5), Some(&*t7)),
            ("stale", Some(&*t5), Some(&*t7)),
        ],
        "the three refusals, newest first; the admitted write is not stored"
    );
    let overview = json(&get(&app, "/api/overview").await.body);
    assert_eq!(overview["refused"]["stale"], 2);
    assert_eq!(overview["unprotected"], 1);
}
