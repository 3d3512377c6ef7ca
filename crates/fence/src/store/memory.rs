//! An in-process high-water store on moka, bounded by entry count, with an eviction floor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use moka::notification::RemovalCause;
use moka::ops::compute::Op;
use moka::sync::Cache;

use super::{HighWaterStore, Raise, RaiseFuture};
use crate::FencingToken;

/// A cached mark. `provisional` marks an entry inserted on a miss whose admission is not
/// decided yet (see [`MemoryStore::raise_now`]); nobody admits against it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    token: u64,
    provisional: bool,
}

/// High-water marks for one process, in a moka cache bounded by entry count.
///
/// Use it when one process is the only writer of its resources. Marks are lost on
/// restart; after a restart every resource starts with no mark (pair it with a durable
/// store, or accept that the first write after a restart is unchecked).
///
/// # The eviction floor
///
/// A bounded cache forgets resources. Forgetting a mark must not let a stale token in, so
/// the store keeps a **floor**: the largest mark it ever evicted. A resource not in the
/// cache is treated as having the floor as its mark. The trade-off: a holder of an old
/// but still valid token for a resource that was evicted is refused (409) when some other
/// evicted resource had a higher mark. That is safe (a refusal, never a wrong admit), and
/// rare when the capacity covers the working set; size the capacity to the number of
/// resources written in a lock's lifetime.
///
/// The floor is raised by moka's eviction listener, which runs *after* the entry left
/// the map. A miss is therefore never trusted on its own: the miss path inserts a
/// provisional entry (moka holds the key's lock while it notifies an eviction of that
/// key, and an insert of the key waits for it), then reads the floor again and admits only
/// if the token is still at least the floor. Entries found in the map admit without
/// touching the floor.
///
/// # Cost
///
/// A hit costs one moka `get`; an insert happens only when the token is newer than the
/// mark. A miss costs two compute calls.
#[derive(Clone)]
pub struct MemoryStore {
    cache: Cache<String, Mark>,
    floor: Arc<AtomicU64>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.cache.policy().max_capacity())
            .field("floor", &self.floor())
            .finish()
    }
}

impl MemoryStore {
    /// A store that keeps at most `capacity` resources' marks.
    pub fn new(capacity: u64) -> Self {
        let floor = Arc::new(AtomicU64::new(0));
        let listener_floor = Arc::clone(&floor);
        let cache = Cache::builder()
            .max_capacity(capacity)
            .eviction_listener(move |_key, mark: Mark, cause| {
                // Replaced and Explicit removals keep or drop nothing a later raise needs;
                // an evicted (Size) or expired mark is forgotten, so the floor takes it.
                if matches!(cause, RemovalCause::Size | RemovalCause::Expired) {
                    listener_floor.fetch_max(mark.token, Ordering::SeqCst);
                }
            })
            .build();
        MemoryStore { cache, floor }
    }

    /// The floor: the largest mark evicted so far (the mark of every resource not cached).
    pub fn floor(&self) -> FencingToken {
        FencingToken::from_u64(self.floor.load(Ordering::SeqCst)).unwrap_or(FencingToken::MAX)
    }

    /// The mark a raise would compare against now: the cached mark, or the floor.
    pub fn mark(&self, resource: &str) -> FencingToken {
        match self.cache.get(resource) {
            Some(m) if !m.provisional => token(m.token),
            Some(m) => token(m.token.max(self.floor.load(Ordering::SeqCst))),
            None => self.floor(),
        }
    }

    /// Runs moka's pending maintenance (evictions and their listener) now.
    pub fn run_pending_tasks(&self) {
        self.cache.run_pending_tasks();
    }

    /// The synchronous raise behind [`HighWaterStore::raise`].
    pub fn raise_now(&self, resource: &str, t: FencingToken) -> Raise {
        let t = t.get();
        // Fast path: one get; a hit decides unless the token is newer than the mark.
        if let Some(m) = self.cache.get(resource) {
            if !m.provisional {
                if t < m.token {
                    return Raise::Stale { highest: token(m.token) };
                }
                if t == m.token {
                    return Raise::Admitted;
                }
            }
        }
        // Slow path: computes on one key are serialized by moka.
        let mut decided = None;
        self.cache.entry_by_ref(resource).and_compute_with(|entry| match entry {
            Some(entry) => {
                let m = entry.into_value();
                // A provisional entry was inserted after every earlier eviction of this
                // key was notified, so the floor read now covers them.
                let current =
                    if m.provisional { m.token.max(self.floor.load(Ordering::SeqCst)) } else { m.token };
                if t < current {
                    decided = Some(Raise::Stale { highest: token(current) });
                    Op::Nop
                } else {
                    decided = Some(Raise::Admitted);
                    Op::Put(Mark { token: t, provisional: false })
                }
            }
            None => Op::Put(Mark { token: t, provisional: true }),
        });
        if let Some(decided) = decided {
            return decided;
        }
        // The provisional insert waited for any eviction of this key to be notified, so
        // the floor now covers the mark this resource had before the miss.
        let floor = self.floor.load(Ordering::SeqCst);
        let admitted = t >= floor;
        let settled = Mark { token: if admitted { t } else { floor }, provisional: false };
        self.cache.entry_by_ref(resource).and_compute_with(|entry| match entry {
            Some(entry) if entry.value() == &(Mark { token: t, provisional: true }) => Op::Put(settled),
            _ => Op::Nop,
        });
        if admitted {
            Raise::Admitted
        } else {
            Raise::Stale { highest: token(floor) }
        }
    }
}

impl HighWaterStore for MemoryStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        Box::pin(std::future::ready(Ok(self.raise_now(resource, token))))
    }
}

fn token(v: u64) -> FencingToken {
    // Every stored value came from a FencingToken.
    FencingToken::from_u64(v).unwrap_or(FencingToken::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: u64) -> FencingToken {
        FencingToken::from_u64(v).unwrap()
    }

    #[test]
    fn raise_admits_equal_and_higher_and_reports_the_mark() {
        let store = MemoryStore::new(10);
        assert_eq!(store.raise_now("a", t(5)), Raise::Admitted);
        assert_eq!(store.raise_now("a", t(5)), Raise::Admitted);
        assert_eq!(store.raise_now("a", t(4)), Raise::Stale { highest: t(5) });
        assert_eq!(store.raise_now("a", t(9)), Raise::Admitted);
        assert_eq!(store.raise_now("a", t(8)), Raise::Stale { highest: t(9) });
        assert_eq!(store.raise_now("b", t(1)), Raise::Admitted, "marks are per resource");
        assert_eq!(store.mark("a"), t(9));
        assert_eq!(store.floor(), t(0));
    }

    #[test]
    fn an_evicted_mark_becomes_the_floor_of_every_unknown_resource() {
        let store = MemoryStore::new(1);
        assert_eq!(store.raise_now("a", t(50)), Raise::Admitted);
        store.run_pending_tasks();
        for i in 0..64 {
            store.raise_now(&format!("other{i}"), t(60 + i));
            store.run_pending_tasks();
        }
        assert!(store.floor() >= t(50), "floor {} after evicting a's mark 50", store.floor());
        // "a" may be gone; a token below its old mark must still be refused...
        assert!(matches!(store.raise_now("a", t(49)), Raise::Stale { highest } if highest >= t(50)));
        // ...and so is an old but valid token of a never-seen resource (the documented cost).
        assert!(!store.raise_now("never-seen", t(10)).is_admitted());
        // A token above everything is always admitted.
        assert_eq!(store.raise_now("a", t(1_000)), Raise::Admitted);
    }

    /// Capacity 100 over 10,000 resources, four threads on disjoint resources: no token
    /// below an earlier admitted token of the same resource is ever admitted, and a
    /// refusal always names a mark above the token. Then, alone, a token above every
    /// earlier one is always admitted (the floor never over-refuses).
    #[test]
    fn capacity_100_over_10000_resources_never_admits_a_stale_token() {
        const RESOURCES: usize = 10_000;
        const THREADS: usize = 4;
        const OPS: usize = 15_000;
        let store = MemoryStore::new(100);
        let clock = Arc::new(AtomicU64::new(1));
        let run = |th: usize, threads: usize, ops: usize, admitted: &mut Vec<u64>| {
            let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (th as u64 + 1) ^ ((ops as u64) << 20);
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let (mut replays_refused, mut fresh_refused) = (0usize, 0usize);
            for _ in 0..ops {
                let r = (next() as usize % (RESOURCES / threads)) * threads + th;
                let key = format!("r{r}");
                let replay = admitted[r] > 0 && next() % 3 == 0;
                let token = if replay {
                    admitted[r] - 1 - next() % admitted[r].min(50)
                } else {
                    clock.fetch_add(1, Ordering::SeqCst)
                };
                match store.raise_now(&key, t(token)) {
                    Raise::Admitted => {
                        assert!(token >= admitted[r], "{key}: admitted {token} after {}", admitted[r]);
                        admitted[r] = token;
                    }
                    Raise::Stale { highest } => {
                        assert!(highest > t(token), "{key}: refused {token} naming mark {highest}");
                        if replay {
                            replays_refused += 1;
                        } else {
                            fresh_refused += 1;
                        }
                    }
                }
            }
            (replays_refused, fresh_refused)
        };
        let totals: Vec<(usize, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|th| {
                    let run = &run;
                    s.spawn(move || run(th, THREADS, OPS, &mut vec![0u64; RESOURCES]))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let replays: usize = totals.iter().map(|x| x.0).sum();
        assert!(replays > 2_000, "replays were refused: {replays}");
        assert!(store.floor() > t(0), "evictions raised the floor");
        // Alone, with fresh resource bookkeeping: every fresh token is admitted.
        let (replays, fresh_refused) = run(0, 1, 10_000, &mut vec![0u64; RESOURCES]);
        assert_eq!(fresh_refused, 0, "a token above every earlier one was refused");
        assert!(replays > 1_000, "replays were refused: {replays}");
        store.run_pending_tasks();
        assert!(store.cache.entry_count() <= 100, "bounded: {}", store.cache.entry_count());
    }

    proptest::proptest! {
        /// Without evictions the store is exactly a map of marks; with a capacity of 2 it
        /// may refuse more, but never admits below a resource's earlier admitted token
        /// and never names a mark at or below a refused token.
        #[test]
        fn behaves_like_a_map_of_marks(ops in proptest::collection::vec((0u8..6, 0u64..40), 1..200)) {
            use std::collections::HashMap;
            let roomy = MemoryStore::new(1_000);
            let tight = MemoryStore::new(2);
            let mut model: HashMap<u8, u64> = HashMap::new();
            let mut tight_admitted: HashMap<u8, u64> = HashMap::new();
            for (r, v) in ops {
                let key = format!("r{r}");
                let expected = match model.get(&r) {
                    Some(&m) if v < m => Raise::Stale { highest: t(m) },
                    _ => Raise::Admitted,
                };
                proptest::prop_assert_eq!(roomy.raise_now(&key, t(v)), expected);
                if expected.is_admitted() {
                    model.insert(r, v);
                }
                match tight.raise_now(&key, t(v)) {
                    Raise::Admitted => {
                        let before = tight_admitted.insert(r, v).unwrap_or(0);
                        proptest::prop_assert!(v >= before, "admitted {} after {}", v, before);
                    }
                    Raise::Stale { highest } => proptest::prop_assert!(highest > t(v)),
                }
                if v % 7 == 0 {
                    tight.run_pending_tasks();
                }
            }
        }
    }
}
