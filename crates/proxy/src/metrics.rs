//! The proxy's metrics, in Prometheus text format on the admin listener's `/metrics`.
//!
//! | metric | labels | counts |
//! |---|---|---|
//! | `palisade_proxy_requests_total` | `route`, `verdict` | requests, by what the proxy decided |
//! | `palisade_proxy_forward_failures_total` | `route`, `error` | requests that failed on the way: `upstream_unavailable` (502), `upstream_timeout` (504), `body_failed` (400: the client's body stalled or broke off) |
//! | `palisade_proxy_request_duration_seconds` | `route` | time to the response head (histogram) |
//! | `palisade_proxy_audit_dropped_events` | | refused and unprotected writes the audit queue had no room for, since the start (gauge) |
//!
//! `route` is the route's pattern as configured (`/orders/{id}`) or `default`, never the
//! raw path, so the series are bounded by the config. `verdict` is one of: `admitted`;
//! `refused_missing_token`, `refused_malformed_token`, `refused_stale`,
//! `refused_store_unavailable` (fenced routes, the layer's refusals);
//! `unprotected_missing_token`, `unprotected_malformed_token`, `unprotected_stale`,
//! `unprotected_store_unavailable` (advisory routes, let through); `unchecked` (open
//! routes, and methods a route does not check); `refused_upgrade`, `refused_bad_path`,
//! `refused_method`, `refused_method_override` (the proxy's own refusals, before the
//! fence). A request's verdict is counted once;
//! a failure on the way after it is counted in the failures.

use palisade_fence::{Enforcement, WriteOutcome};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The proxy's counters; clones share them.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    registry: Registry,
    requests: IntCounterVec,
    failures: IntCounterVec,
    duration: HistogramVec,
    audit_dropped: IntGauge,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics::new()
    }
}

impl ProxyMetrics {
    /// Fresh counters in their own registry.
    ///
    /// # Panics
    ///
    /// Never: the metric names are fixed and valid.
    pub fn new() -> ProxyMetrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "palisade_proxy_requests_total",
                "Requests, by route pattern and verdict",
            ),
            &["route", "verdict"],
        )
        .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "palisade_proxy_forward_failures_total",
                "Requests that failed on the way to or from the upstream, by route pattern and error",
            ),
            &["route", "error"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "palisade_proxy_request_duration_seconds",
                "Time to the response head, by route pattern",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ]),
            &["route"],
        )
        .expect("valid metric");
        let audit_dropped = IntGauge::new(
            "palisade_proxy_audit_dropped_events",
            "Refused and unprotected writes the audit queue had no room for, since the start",
        )
        .expect("valid metric");
        registry
            .register(Box::new(requests.clone()))
            .expect("registered once");
        registry
            .register(Box::new(failures.clone()))
            .expect("registered once");
        registry
            .register(Box::new(duration.clone()))
            .expect("registered once");
        registry
            .register(Box::new(audit_dropped.clone()))
            .expect("registered once");
        ProxyMetrics {
            registry,
            requests,
            failures,
            duration,
            audit_dropped,
        }
    }

    /// The hot series of route `label`, resolved once (a labelled lookup hashes the
    /// labels on every call).
    pub(crate) fn route(&self, label: &str) -> RouteCounters {
        RouteCounters {
            admitted: self.requests.with_label_values(&[label, "admitted"]),
            unchecked: self.requests.with_label_values(&[label, "unchecked"]),
            duration: self.duration.with_label_values(&[label]),
        }
    }

    pub(crate) fn count(&self, route: &str, verdict: &str) {
        self.requests.with_label_values(&[route, verdict]).inc();
    }

    pub(crate) fn forward_failed(&self, route: &str, error: &str) {
        self.failures.with_label_values(&[route, error]).inc();
    }

    /// The requests counted for `route` and `verdict` so far.
    pub fn requests(&self, route: &str, verdict: &str) -> u64 {
        self.requests.with_label_values(&[route, verdict]).get()
    }

    pub(crate) fn set_audit_dropped(&self, dropped: u64) {
        self.audit_dropped
            .set(i64::try_from(dropped).unwrap_or(i64::MAX));
    }

    /// Everything, in Prometheus text format.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

/// One route's series that most requests touch.
#[derive(Clone, Debug)]
pub(crate) struct RouteCounters {
    pub(crate) admitted: IntCounter,
    pub(crate) unchecked: IntCounter,
    pub(crate) duration: Histogram,
}

/// The `verdict` label of a checked write.
pub(crate) fn verdict(outcome: WriteOutcome, enforcement: Enforcement) -> &'static str {
    match (enforcement, outcome) {
        (_, WriteOutcome::Admitted) => "admitted",
        (Enforcement::Fenced, WriteOutcome::MissingToken) => "refused_missing_token",
        (Enforcement::Fenced, WriteOutcome::MalformedToken) => "refused_malformed_token",
        (Enforcement::Fenced, WriteOutcome::Stale) => "refused_stale",
        (Enforcement::Fenced, _) => "refused_store_unavailable",
        (_, WriteOutcome::MissingToken) => "unprotected_missing_token",
        (_, WriteOutcome::MalformedToken) => "unprotected_malformed_token",
        (_, WriteOutcome::Stale) => "unprotected_stale",
        (_, _) => "unprotected_store_unavailable",
    }
}
