//! `op_rate_quota`: a token bucket per namespace (GCRA, the `governor` crate).
//!
//! # Quotas (per namespace)
//!
//! `held_lease_quota` ([`Namespace`](palisade_api::Namespace)): at most that many sessions
//! opened with the namespace, holds and waits of the namespace at once, across all
//! replicas. A session opened with `"namespace"` takes a slot for as long as its lease
//! lives (caller granted some class of the namespace, or its admin; over the quota: 429
//! and the session is revoked at once). Each acquire takes a slot (a key
//! `<root>quota/<ns>/...` on the session's lease) before it waits; the slot is deleted
//! when the wait fails, when the hold is released, or with the session's lease (closed,
//! or expired: it stops counting within one TTL). Taking a slot counts the namespace's
//! slots at a revision and creates the new one in a Txn that compares the whole slot
//! range against that revision, so concurrent acquires through any replicas never
//! exceed the quota. Over the quota: 429 `quota-exceeded`, naming `held_lease_quota`.
//! A session opened without a namespace counts only through its holds and waits (it
//! may lock in several namespaces). A
//! lowered quota refuses new slots until the count is below it; existing holds stay.
//! A hold force-released keeps its slot until its session releases it or ends.
//!
//! `op_rate_quota`: acquire, release and status calls of a namespace draw from a token
//! bucket of `op_rate_quota` operations refilled at `op_rate_quota` per second; an empty
//! bucket answers 429 `quota-exceeded` naming `op_rate_quota`, with `Retry-After` in
//! whole seconds. Each replica keeps its own buckets, so `n` replicas admit up to
//! `n × op_rate_quota` operations per second in all.
//!

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::problem::Problem;
use palisade_api::ProblemKind;

/// The buckets of one replica, by namespace. A bucket holds `op_rate_quota` operations
/// and refills at `op_rate_quota` per second; it is rebuilt (full) when the quota
/// changes.
#[derive(Default)]
pub(super) struct RateLimits {
    buckets: Mutex<HashMap<String, (u32, Arc<DefaultDirectRateLimiter>)>>,
}

impl RateLimits {
    /// Takes one operation from `ns`'s bucket.
    ///
    /// # Errors
    ///
    /// 429 `quota-exceeded` naming `op_rate_quota`, with `Retry-After` (whole seconds,
    /// at least 1), when the bucket is empty or the quota is 0.
    pub(super) fn check(&self, ns: &str, per_second: u32) -> Result<(), Problem> {
        let over = |wait: Duration| {
            Problem::new(
                ProblemKind::QuotaExceeded,
                format!(
                    "op_rate_quota of namespace {ns} reached: {per_second} operations per second"
                ),
            )
            .with_retry_after(wait)
        };
        let Some(rate) = NonZeroU32::new(per_second) else {
            return Err(over(Duration::from_secs(1)));
        };
        let limiter = {
            let mut buckets = self
                .buckets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match buckets.get(ns) {
                Some((q, l)) if *q == per_second => l.clone(),
                _ => {
                    let l = Arc::new(RateLimiter::direct(Quota::per_second(rate)));
                    buckets.insert(ns.to_owned(), (per_second, l.clone()));
                    l
                }
            }
        };
        limiter
            .check()
            .map_err(|not_until| over(not_until.wait_time_from(DefaultClock::default().now())))
    }
}
