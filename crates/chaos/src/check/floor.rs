//! The largest value recorded strictly before a moment.
//!
//! Real-time order between entries of different workers comes from `at_ns` alone: an entry
//! recorded at `t` happened after everything recorded before `t`, and entries recorded at the
//! same nanosecond are concurrent. A [`Floor`] answers "what is the largest value recorded
//! strictly before `t`?" for entries fed in time order, in constant memory.

/// The maximum (by `key`) of the values recorded so far, as seen from a later moment.
#[derive(Debug, Clone)]
pub(crate) struct Floor<E> {
    /// The largest value recorded before `recent_at`.
    settled: Option<(u64, E)>,
    /// The largest value recorded at `recent_at`.
    recent: Option<(u64, E)>,
    recent_at: u64,
}

impl<E: Clone> Floor<E> {
    pub(crate) fn new() -> Self {
        Floor {
            settled: None,
            recent: None,
            recent_at: 0,
        }
    }

    /// Records `value` with ordering key `key` at `at_ns` (fed in non-decreasing `at_ns`).
    pub(crate) fn record(&mut self, at_ns: u64, key: u64, value: E) {
        if at_ns > self.recent_at {
            if let Some(recent) = self.recent.take() {
                keep_max(&mut self.settled, recent);
            }
            self.recent_at = at_ns;
            self.recent = Some((key, value));
        } else if at_ns == self.recent_at {
            keep_max(&mut self.recent, (key, value));
        } else {
            // Out of time order (reported by the caller): count it as settled, the
            // stricter reading.
            keep_max(&mut self.settled, (key, value));
        }
    }

    /// The largest value recorded strictly before `at_ns`.
    pub(crate) fn before(&self, at_ns: u64) -> Option<&(u64, E)> {
        let recent = self.recent.as_ref().filter(|_| self.recent_at < at_ns);
        match (&self.settled, recent) {
            (Some(s), Some(r)) => Some(if r.0 > s.0 { r } else { s }),
            (s, r) => s.as_ref().or(r),
        }
    }
}

fn keep_max<E>(slot: &mut Option<(u64, E)>, candidate: (u64, E)) {
    if slot.as_ref().is_none_or(|current| candidate.0 > current.0) {
        *slot = Some(candidate);
    }
}

#[cfg(test)]
mod tests {
    use super::Floor;

    #[test]
    fn a_value_counts_only_for_later_moments() {
        let mut floor = Floor::new();
        assert!(floor.before(5).is_none());
        floor.record(10, 7, "a");
        assert!(floor.before(10).is_none(), "same nanosecond is concurrent");
        assert_eq!(floor.before(11).unwrap().1, "a");
        floor.record(12, 3, "b");
        assert_eq!(
            floor.before(13).unwrap().1,
            "a",
            "a smaller key does not replace a larger"
        );
        floor.record(12, 9, "c");
        assert_eq!(floor.before(12).unwrap().1, "a");
        assert_eq!(floor.before(13).unwrap().1, "c");
        floor.record(20, 1, "d");
        assert_eq!(floor.before(20).unwrap().1, "c");
        assert_eq!(floor.before(21).unwrap().1, "c");
    }
}
