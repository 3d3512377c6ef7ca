//! Trace spans per etcd call, and the expiries metric.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use super::{acquire_body, call, fixture, open, OTHER, OWNER};

/// One span as the capturing layer saw it.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    fields: BTreeMap<String, String>,
    /// Names of the enclosing spans, innermost first.
    parents: Vec<&'static str>,
}

/// Every span seen, and where each live span id is in that list.
type Seen = (Vec<Captured>, BTreeMap<u64, usize>);

/// A layer that keeps every span with its fields.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parents = ctx
            .span_scope(id)
            .map(|scope| scope.skip(1).map(|s| s.name()).collect())
            .unwrap_or_default();
        let mut all = self.0.lock().unwrap();
        all.0.push(Captured {
            name: attrs.metadata().name(),
            fields,
            parents,
        });
        let at = all.0.len() - 1;
        all.1.insert(id.into_u64(), at);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut all = self.0.lock().unwrap();
        if let Some(&at) = all.1.get(&id.into_u64()) {
            values.record(&mut Fields(&mut all.0[at].fields));
        }
    }
}

impl Capture {
    fn etcd_spans(&self) -> Vec<Captured> {
        let all = self.0.lock().unwrap();
        all.0.iter().filter(|s| s.name == "etcd").cloned().collect()
    }
    fn clear(&self) {
        let mut all = self.0.lock().unwrap();
        all.0.clear();
        all.1.clear();
    }
}

// The runtime of `#[tokio::test]` is single-threaded, so the replica's tasks run on this
// thread and the thread's default subscriber sees their spans.
#[tokio::test]
async fn etcd_an_acquire_runs_its_etcd_calls_in_etcd_spans_under_the_request_span() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let s1 = open(addr, OWNER, 10_000).await;
    let s2 = open(addr, OTHER, 10_000).await;
    capture.clear();

    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s1, "k", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let spans = capture.etcd_spans();
    let ops: Vec<&str> = spans.iter().map(|s| s.fields["op"].as_str()).collect();
    // The quota slot is taken in the acquire's own Txn: no quota call of its own.
    for op in [
        "session.record_get",
        "config.get",
        "acquire.grant_or_enqueue",
    ] {
        assert!(ops.contains(&op), "no {op} span in {ops:?}");
    }
    for s in &spans {
        assert_eq!(s.fields["attempt"], "1", "{s:?}");
        assert_eq!(
            s.fields.get("outcome").map(String::as_str),
            Some("ok"),
            "{s:?}"
        );
        assert!(
            s.parents.contains(&"request"),
            "not under the request span: {s:?}"
        );
    }

    // Contended: the waiter watches the key ahead of it, in an `acquire.watch` span.
    capture.clear();
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OTHER,
        acquire_body(&s2, "k", 300),
    )
    .await;
    assert_eq!(r.status, 409, "{:?}", r.body);
    // The failed wait's cleanup Txn (which frees its quota slot too): let it finish.
    let settled_by = tokio::time::Instant::now() + Duration::from_secs(3);
    while capture
        .etcd_spans()
        .iter()
        .any(|s| !s.fields.contains_key("outcome"))
        && tokio::time::Instant::now() < settled_by
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spans = capture.etcd_spans();
    assert!(
        spans.iter().any(|s| s.fields["op"] == "acquire.watch"),
        "{:?}",
        spans.iter().map(|s| &s.fields["op"]).collect::<Vec<_>>()
    );
    assert!(
        spans.iter().any(|s| s.fields["op"] == "acquire.cleanup"),
        "{spans:?}"
    );
    for s in &spans {
        assert!(s.fields.contains_key("outcome"), "{s:?}");
        assert!(
            s.parents.contains(&"request"),
            "not under the request span: {s:?}"
        );
    }
}

/// The value of one sample in Prometheus text, 0 if absent.
fn sample(text: &Value, series: &str) -> f64 {
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn etcd_expiries_metric_counts_a_session_and_a_hold_found_expired() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let metrics = || async move { call(addr, "GET", "/metrics", OWNER, Value::Null).await.body };
    let session_series = r#"palisade_expiries_total{kind="session"}"#;
    let hold_series = r#"palisade_expiries_total{kind="hold"}"#;

    // 2 s is etcd's minimum lease TTL.
    let s = open(addr, OWNER, 2_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let grant_rev = r.body["grant_rev"].clone();
    // A live session's keepalive and a bad session id count nothing.
    let ka = format!("/v1/sessions/{s}/keepalive");
    assert_eq!(
        call(addr, "POST", &ka, OWNER, Value::Null).await.status,
        200
    );
    assert_eq!(
        call(
            addr,
            "POST",
            "/v1/sessions/zz/keepalive",
            OWNER,
            Value::Null
        )
        .await
        .status,
        400
    );
    let m = metrics().await;
    assert_eq!(sample(&m, session_series), 0.0);
    assert_eq!(sample(&m, hold_series), 0.0);

    // No keepalive: the lease expires (within TTL + etcd's lease checking).
    let status = "/v1/locks/status?namespace=ns&class=c&key=k";
    let gone_by = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st = call(addr, "GET", status, OWNER, Value::Null).await;
        if st.body["holders"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < gone_by,
            "the lease did not expire"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let r = call(addr, "POST", &ka, OWNER, Value::Null).await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    let rel = serde_json::json!({ "session": s, "namespace": "ns", "class": "c", "key": "k",
                                  "mode": "exclusive", "grant_rev": grant_rev });
    let r = call(addr, "POST", "/v1/locks/release", OWNER, rel).await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    let m = metrics().await;
    assert_eq!(sample(&m, session_series), 1.0, "{m}");
    assert_eq!(sample(&m, hold_series), 1.0, "{m}");
}
