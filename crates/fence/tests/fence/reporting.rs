//! What the layer reports about refusals: refusal events without the admitted fenced
//! writes, and the Prometheus counters, over real HTTP on loopback.

use axum::routing::put;
use axum::Router;
use http::{Method, StatusCode};
use palisade_fence::{
    ChannelObserver, Enforcement, EnforcementTable, FenceLayer, MemoryStore, WriteOutcome,
};

use crate::common::{client, send, serve, tok};

fn app(layer: FenceLayer) -> Router {
    Router::new()
        .route("/{*path}", put(|| async { "written" }))
        .layer(layer)
}

fn table() -> EnforcementTable {
    EnforcementTable::new(Enforcement::Fenced).with_prefix("/legacy/", Enforcement::Advisory)
}

#[tokio::test]
async fn refused_events_report_each_refusal_with_token_and_mark_but_no_admitted_write() {
    let (observer, mut events) = ChannelObserver::bounded(64);
    let layer = FenceLayer::new(MemoryStore::new(1_000))
        .with_enforcement_table(table())
        .with_observer(observer)
        .with_refused_events();
    let addr = serve(app(layer)).await;
    let c = client();
    let (t5, t7) = (tok(5).to_string(), tok(7).to_string());
    let statuses = [
        send(&c, Method::PUT, addr, "/orders/1", &[&t7])
            .await
            .status,
        send(&c, Method::PUT, addr, "/orders/1", &[&t5])
            .await
            .status,
        send(&c, Method::PUT, addr, "/orders/1", &[]).await.status,
        send(&c, Method::PUT, addr, "/orders/1", &["x"])
            .await
            .status,
        send(&c, Method::PUT, addr, "/orders/1", &[&t7])
            .await
            .status,
        send(&c, Method::PUT, addr, "/legacy/1", &[]).await.status,
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [200, 409, 428, 400, 200, 200]);
    let mut got = Vec::new();
    while let Ok(e) = events.try_recv() {
        got.push((
            e.resource,
            e.outcome,
            e.token,
            e.highest,
            e.rejected,
            e.unprotected,
        ));
    }
    assert_eq!(
        got,
        vec![
            ("/orders/1".to_owned(), WriteOutcome::Stale, Some(tok(5)), Some(tok(7)), true, false),
            ("/orders/1".to_owned(), WriteOutcome::MissingToken, None, None, true, false),
            ("/orders/1".to_owned(), WriteOutcome::MalformedToken, None, None, true, false),
            ("/legacy/1".to_owned(), WriteOutcome::MissingToken, None, None, false, true),
        ],
        "the three refusals and the unprotected write, in order; the two admitted fenced writes not"
    );
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_count_admitted_refused_by_reason_and_unprotected_by_finding() {
    use palisade_fence::FenceMetrics;

    let metrics = FenceMetrics::new();
    // No observer: the counters do not depend on one.
    let layer = FenceLayer::new(MemoryStore::new(1_000))
        .with_enforcement_table(table())
        .with_metrics(&metrics);
    let addr = serve(app(layer)).await;
    let c = client();
    let (t5, t7, t9) = (tok(5).to_string(), tok(7).to_string(), tok(9).to_string());
    let cases: [(&str, &[&str], u16); 9] = [
        ("/orders/1", &[&t7], 200),
        ("/orders/1", &[&t5], 409),
        ("/orders/1", &[&t5], 409),
        ("/orders/1", &[], 428),
        ("/orders/1", &["1", "2"], 400),
        ("/orders/2", &[&t9], 200),
        ("/legacy/1", &[], 200),
        ("/legacy/1", &[&t9], 200),
        ("/legacy/1", &[&t5], 200),
    ];
    for (path, tokens, status) in cases {
        let r = send(&c, Method::PUT, addr, path, tokens).await;
        assert_eq!(
            r.status,
            StatusCode::from_u16(status).unwrap(),
            "{path} {tokens:?}"
        );
    }
    let text = metrics.render();
    for line in [
        "palisade_fence_admitted_total 3",
        "palisade_fence_refused_total{reason=\"stale\"} 2",
        "palisade_fence_refused_total{reason=\"missing_token\"} 1",
        "palisade_fence_refused_total{reason=\"malformed_token\"} 1",
        "palisade_fence_refused_total{reason=\"store_unavailable\"} 0",
        "palisade_fence_unprotected_total{finding=\"missing_token\"} 1",
        "palisade_fence_unprotected_total{finding=\"stale\"} 1",
        "palisade_fence_unprotected_total{finding=\"malformed_token\"} 0",
        "# TYPE palisade_fence_refused_total counter",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    // A clone of the layer (another connection's service) counts into the same counters.
    let r = send(&c, Method::PUT, addr, "/orders/3", &[&t9]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(metrics
        .render()
        .contains("palisade_fence_admitted_total 4\n"));
}
