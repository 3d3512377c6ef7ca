//! Prometheus metrics of one replica, served at `GET /metrics` (text format 0.0.4).

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::problem::ProblemSeen;
use palisade_api::ProblemKind;

/// The replica's metrics. Names and units:
///
/// - `palisade_grants_total`: acquires answered with a hold.
/// - `palisade_acquire_wait_seconds`: histogram of the time from an acquire's start to
///   its answer (grant or not), in seconds.
/// - `palisade_waits_timed_out_total`: acquires whose wait deadline passed.
/// - `palisade_releases_total`: releases answered 204.
/// - `palisade_holds_lost_total`: releases and keepalives that found the hold or session
///   gone (expired or force-released).
/// - `palisade_quota_rejections_total{quota}`: 429s, by `held_lease_quota` or
///   `op_rate_quota`.
/// - `palisade_etcd_errors_total`: answers 502 or 503 because etcd failed.
/// - `palisade_expiries_total{kind}`: session leases this replica found expired, as it
///   observes them (a replica runs no keepalive and sees no lease end by itself):
///   `kind="session"`, a keepalive naming a session whose lease etcd no longer has;
///   `kind="hold"`, a release naming a hold whose session's lease is gone (the hold
///   ended with the lease). A session closed through the service and then kept alive or
///   released counts too: etcd tells a revoked lease from an expired one to no one. The
///   audit trail records every expiry, seen or not.
#[derive(Clone)]
pub(super) struct Metrics {
    registry: Registry,
    pub(super) grants: IntCounter,
    pub(super) wait_seconds: Histogram,
    pub(super) timeouts: IntCounter,
    pub(super) releases: IntCounter,
    pub(super) lost: IntCounter,
    pub(super) quota_rejections: IntCounterVec,
    pub(super) etcd_errors: IntCounter,
    pub(super) expiries: IntCounterVec,
}

impl Metrics {
    pub(super) fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric name");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c
        };
        let grants = counter("palisade_grants_total", "Acquires answered with a hold.");
        let timeouts = counter(
            "palisade_waits_timed_out_total",
            "Acquires whose wait deadline passed.",
        );
        let releases = counter("palisade_releases_total", "Releases answered 204.");
        let lost = counter(
            "palisade_holds_lost_total",
            "Releases and keepalives that found the hold or session gone (expired or forced).",
        );
        let etcd_errors = counter(
            "palisade_etcd_errors_total",
            "Answers 502 or 503 because etcd failed.",
        );
        let wait_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "palisade_acquire_wait_seconds",
                "Time from an acquire's start to its answer, in seconds.",
            )
            .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0]),
        )
        .expect("valid histogram");
        registry
            .register(Box::new(wait_seconds.clone()))
            .expect("registered once");
        let quota_rejections = IntCounterVec::new(
            Opts::new("palisade_quota_rejections_total", "429 answers, by quota."),
            &["quota"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(quota_rejections.clone()))
            .expect("registered once");
        let expiries = IntCounterVec::new(
            Opts::new(
                "palisade_expiries_total",
                "Session leases found expired: by a keepalive (session) or a release (hold).",
            ),
            &["kind"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(expiries.clone()))
            .expect("registered once");
        Metrics {
            registry,
            expiries,
            grants,
            wait_seconds,
            timeouts,
            releases,
            lost,
            quota_rejections,
            etcd_errors,
        }
    }

    /// Counts an error answer by its kind (and, for quotas, which one).
    pub(super) fn problem(&self, seen: ProblemSeen) {
        match seen.kind {
            ProblemKind::QuotaExceeded => {
                let quota = if seen.op_rate {
                    "op_rate_quota"
                } else {
                    "held_lease_quota"
                };
                self.quota_rejections.with_label_values(&[quota]).inc();
            }
            ProblemKind::DeadlineExceeded => self.timeouts.inc(),
            ProblemKind::NotHeld | ProblemKind::SessionLost => self.lost.inc(),
            ProblemKind::QuorumLost | ProblemKind::Upstream => self.etcd_errors.inc(),
            _ => {}
        }
    }

    /// The text exposition of every metric.
    pub(super) fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
