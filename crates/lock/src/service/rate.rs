//! `op_rate_quota`: a token bucket per namespace (GCRA, the `governor` crate).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::problem::{Problem, ProblemKind};

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
