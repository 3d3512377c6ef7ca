//! The dashboard with etcd, over what the tailer stored from real lock traffic: a lock's
//! timeline found by the name used everywhere else, with times, tier and the gap that
//! cuts its history; holds and waiters now. Every test here starts etcd.

use std::time::{Duration, SystemTime};

use etcd_client::CompactionOptions;
use palisade_audit::dashboard::{router_with_live, Live};
use palisade_lock::Namespace;
use serde_json::Value;

use crate::common::{eventually, get};
use crate::tailer_etcd::{fixture, NS, ROOT};

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn kinds(timeline: &Value) -> Vec<String> {
    timeline["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn etcd_timeline_by_full_name_shows_times_tier_and_the_gap_that_hides_a_key() {
    let started = SystemTime::now();
    let fx = fixture().await;
    let mut ns = Namespace::new(NS, "acme");
    ns.cluster_tier = "gold".into();
    fx.locker.config().put_namespace(&ns).await.unwrap();
    let tailer = fx.start_tailer();
    fx.cycles("a", "inv/42", 1).await;
    fx.wait_caught_up().await;
    tailer.abort();
    let _ = tailer.await;
    // While the tailer is down: a key granted and released only here, and one more
    // cycle of inv/42; then history is compacted past them.
    fx.cycles("b", "hidden/7", 1).await;
    fx.cycles("b", "inv/42", 1).await;
    let compacted = fx.revision().await;
    let mut client = fx.locker.client().clone();
    client
        .compact(compacted, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    fx.cycles("c", "inv/42", 1).await;
    let tailer = fx.start_tailer();
    fx.wait_caught_up().await;
    tailer.abort();

    let live = Live::connect(&fx.etcd.endpoints(), None, ROOT)
        .await
        .unwrap();
    let app = router_with_live(fx.pool.clone(), live);
    let full = json(
        &get(&app, "/api/locks?key=orders%2Frows%2Finv%2F42")
            .await
            .body,
    );
    assert_eq!(
        kinds(&full),
        ["release", "grant", "gap", "release", "grant"],
        "newest first, the gap between the cycles before and after it: {full}"
    );
    let gap = &full["events"][2];
    assert_eq!(gap["gap_to"].as_u64().unwrap() as i64, compacted);
    let bare = json(&get(&app, "/api/locks?key=inv%2F42").await.body);
    assert_eq!(kinds(&bare), kinds(&full), "the bare key finds the same");
    let now = SystemTime::now();
    for e in full["events"].as_array().unwrap() {
        let at = humantime::parse_rfc3339(e["recorded_at"].as_str().unwrap()).unwrap();
        // Seconds precision: the start rounded down.
        assert!(at + Duration::from_secs(1) >= started && at <= now, "{e}");
    }

    let page = get(&app, "/locks?key=orders%2Frows%2Finv%2F42").await.body;
    assert_eq!(
        page.matches("<td class=\"tier\">gold</td>").count(),
        4,
        "each event shows the namespace's tier"
    );
    assert_eq!(page.matches("<tr class=\"gap\">").count(), 1);
    assert!(
        page.contains(&format!("to {compacted} were compacted")),
        "{page}"
    );
    assert!(
        page.contains("<option value=\"orders/rows/inv/42\">"),
        "the field offers the known lock"
    );

    let hidden = get(&app, "/locks?key=orders%2Frows%2Fhidden%2F7")
        .await
        .body;
    assert!(hidden.contains("No events for <code>orders/rows/hidden/7</code>"));
    assert!(
        hidden.contains("may be in the audit gaps below") && hidden.contains("<tr class=\"gap\">"),
        "a key that lived only inside the gap points at it: {hidden}"
    );
}

#[tokio::test]
async fn etcd_overview_counts_the_holds_and_waiters_in_etcd_now() {
    let fx = fixture().await;
    let live = Live::connect(&fx.etcd.endpoints(), None, ROOT)
        .await
        .unwrap();
    let app = router_with_live(fx.pool.clone(), live);
    let counts = |v: &Value| (v["holds_now"].as_u64(), v["waiters_now"].as_u64());
    assert_eq!(
        counts(&json(&get(&app, "/api/overview").await.body)),
        (Some(0), Some(0))
    );

    let a = fx.session("a", Duration::from_secs(10)).await;
    let b = fx.session("b", Duration::from_secs(10)).await;
    let held = fx.acquire(&a, "k1").await;
    let _other = fx.acquire(&a, "k2").await;
    let waiting = {
        let locker = fx.locker.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            locker
                .acquire(
                    &b,
                    &palisade_lock::LockName::new(NS, crate::tailer_etcd::CLASS, "k1"),
                    palisade_lock::Mode::Exclusive,
                    deadline,
                )
                .await
                .map(|hold| (hold, b))
        })
    };
    eventually("two holds and one waiter", || async {
        counts(&json(&get(&app, "/api/overview").await.body)) == (Some(2), Some(1))
    })
    .await;
    let page = get(&app, "/").await.body;
    assert!(
        page.contains("Holds now</div><div class=\"value\">2</div>"),
        "{page}"
    );
    assert!(page.contains("Waiters now</div><div class=\"value\">1</div>"));

    held.release().await.unwrap();
    let (_hold, _b) = waiting.await.unwrap().unwrap();
    assert_eq!(
        counts(&json(&get(&app, "/api/overview").await.body)),
        (Some(2), Some(0)),
        "the waiter got the lock"
    );

    let without = palisade_audit::dashboard::router(fx.pool.clone());
    let v = json(&get(&without, "/api/overview").await.body);
    assert_eq!(counts(&v), (None, None), "unknown without etcd, not 0");
}
