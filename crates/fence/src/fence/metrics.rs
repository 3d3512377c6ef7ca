//! Prometheus counters of the layer's decisions.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use super::observer::WriteOutcome;
use super::policy::Enforcement;

/// The label value of a [`WriteOutcome`] that is not `Admitted`.
fn finding(outcome: WriteOutcome) -> &'static str {
    match outcome {
        WriteOutcome::Admitted => "current",
        WriteOutcome::MissingToken => "missing_token",
        WriteOutcome::MalformedToken => "malformed_token",
        WriteOutcome::Stale => "stale",
        WriteOutcome::StoreUnavailable => "store_unavailable",
    }
}

/// Every value of the `reason` and `finding` labels, so each series exists (at 0) from
/// the start and `rate()` sees its first increase.
const FINDINGS: [&str; 4] = [
    "missing_token",
    "malformed_token",
    "stale",
    "store_unavailable",
];

/// Counters of the writes a [`FenceLayer`](crate::FenceLayer) checked, in Prometheus
/// text format (0.0.4) for the resource service to serve (usually at `GET /metrics`).
/// Set with [`FenceLayer::with_metrics`](crate::FenceLayer::with_metrics); clones share
/// the counters.
///
/// | metric | labels | counts |
/// |---|---|---|
/// | `palisade_fence_admitted_total` | — | writes with a current token (the mark was raised), fenced or advisory |
/// | `palisade_fence_refused_total` | `reason`: `missing_token` (428), `malformed_token` (400), `stale` (409), `store_unavailable` (503) | writes to fenced resources the layer refused |
/// | `palisade_fence_unprotected_total` | `finding`: the same four values | writes to advisory resources let through without a current token |
///
/// No label names a resource or caller: their number is unbounded (the audit trail
/// keeps them).
///
/// ```
/// use palisade_fence::{FenceLayer, FenceMetrics, MemoryStore};
///
/// let metrics = FenceMetrics::new();
/// let layer = FenceLayer::new(MemoryStore::new(1_000)).with_metrics(&metrics);
/// # drop(layer);
/// assert!(metrics.render().contains("palisade_fence_refused_total{reason=\"stale\"} 0"));
/// ```
#[derive(Debug, Clone)]
pub struct FenceMetrics {
    registry: Registry,
    admitted: IntCounter,
    refused: IntCounterVec,
    unprotected: IntCounterVec,
}

impl Default for FenceMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl FenceMetrics {
    /// Counters at 0, in a registry of their own.
    pub fn new() -> Self {
        let registry = Registry::new();
        let admitted = IntCounter::new(
            "palisade_fence_admitted_total",
            "Checked writes with a current fencing token (the resource's mark was raised).",
        )
        .expect("valid metric");
        let refused = IntCounterVec::new(
            Opts::new(
                "palisade_fence_refused_total",
                "Writes to fenced resources the fence layer refused, by reason.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let unprotected = IntCounterVec::new(
            Opts::new(
                "palisade_fence_unprotected_total",
                "Writes to advisory resources let through without a current fencing token, by finding.",
            ),
            &["finding"],
        )
        .expect("valid metric");
        for f in FINDINGS {
            refused.with_label_values(&[f]);
            unprotected.with_label_values(&[f]);
        }
        for c in [
            Box::new(admitted.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(refused.clone()),
            Box::new(unprotected.clone()),
        ] {
            registry.register(c).expect("registered once");
        }
        FenceMetrics {
            registry,
            admitted,
            refused,
            unprotected,
        }
    }

    /// Counts one checked write.
    pub(crate) fn count(&self, outcome: WriteOutcome, enforcement: Enforcement) {
        match (outcome, enforcement) {
            (WriteOutcome::Admitted, _) => self.admitted.inc(),
            (o, Enforcement::Fenced) => self.refused.with_label_values(&[finding(o)]).inc(),
            (o, Enforcement::Advisory) => self.unprotected.with_label_values(&[finding(o)]).inc(),
        }
    }

    /// The registry holding the counters, to gather them with a service's own metrics.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition (format 0.0.4) of the counters.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}
