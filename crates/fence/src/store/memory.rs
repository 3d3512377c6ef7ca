//! An in-process high-water store: marks keyed by a keyed 64-bit hash of the resource, in
//! locked shards, bounded by entry count, with an eviction floor.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::{HighWaterStore, Raise, RaiseFuture, StoreError};
use crate::FencingToken;

/// Shards of a store of at least `SHARD_SPAN · SHARDS_MAX` resources; smaller stores get
/// fewer (one per `SHARD_SPAN` resources, a power of two), so a small capacity is not
/// spread thin.
const SHARDS_MAX: usize = 64;
const SHARD_SPAN: u64 = 1024;
/// How many of a shard's oldest entries an eviction looks at; it evicts the lowest mark.
const SAMPLE: usize = 4;

/// High-water marks for one process, bounded by entry count.
///
/// Use it when one process is the only writer of its resources. Marks are lost on
/// restart; after a restart every resource starts with no mark (pair it with a durable
/// store, or accept that the first write after a restart is unchecked).
///
/// # Layout and cost
///
/// A resource is kept as its 64-bit hash under SipHash-1-3 with keys drawn at random for
/// each store (`std`'s `RandomState`), mapped to its mark: 16 bytes of entry in a
/// `HashMap` plus 8 in an insertion-order queue, in one of up to 64 shards each behind
/// its own `RwLock`. At 1 million resources that is about 40–60 bytes per resource
/// (`palisade-bench memory-store`; the name itself is never stored). A raise hashes the
/// name once and takes its shard's lock once: a read lock when the token is at or below
/// the mark (a holder writing again, or a stale token), a write lock to raise or insert.
/// Nothing is locked across shards.
///
/// # Hash collisions can only refuse
///
/// Two resources whose hashes are equal share one entry, whose mark is the larger of
/// their admitted tokens. A raise then compares against a mark at least as high as its
/// own resource's: every token that separate marks would refuse is still refused, and a
/// token may be refused that separate marks would have admitted (a 409 for a valid
/// holder), never the reverse. The chance that any two of `n` resources collide is at
/// most `n(n-1)/2 / 2^64`: about 2.7 · 10^-8 at 1 million resources, 2.7 · 10^-6 at 10
/// million. The hash keys are secret and random per store, so a caller cannot pick names
/// that collide on purpose.
///
/// # The eviction floor
///
/// A bounded store forgets resources. Forgetting a mark must not let a stale token in, so
/// the store keeps a **floor**: the largest mark it ever evicted. A resource not in the
/// store is treated as having the floor as its mark. The trade-off: a holder of an old
/// but still valid token for a resource that was evicted is refused (409) when some other
/// evicted resource had a higher mark. That is safe (a refusal, never a wrong admit), and
/// rare when the capacity covers the working set; size the capacity to the number of
/// resources written in a lock's lifetime.
///
/// The store counts its marks; an insert that would pass the capacity first evicts from
/// the shard it is in (so no lock is ever taken across shards). The shard looks at its
/// four oldest entries (in insertion order) and evicts the one
/// with the lowest mark (tokens grow with time, so that is roughly the least recently
/// raised, and it keeps the floor as low as it can); the other three go to the back of
/// the queue. The floor is raised to the evicted mark under the shard's write lock, before
/// the lock is released, and a raise of a resource not in its shard reads the floor under
/// that same lock: so a raise after an eviction always sees a floor at or above the mark
/// it forgot. A full store whose shard holds nothing to evict keeps nothing: the admitted
/// token goes straight to the floor (so does every token of a store of capacity 0). The
/// store never holds more than `capacity` marks.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[RwLock<Shard>]>,
    floor: AtomicU64,
    keyer: Keyer,
    capacity: u64,
    /// Marks kept, counted before each insert; at most `capacity` once every insert in
    /// flight has finished its eviction.
    kept: AtomicUsize,
}

/// How a resource name becomes its key.
enum Keyer {
    Random(RandomState),
    /// Tests choose keys to force collisions.
    #[cfg(test)]
    Fixed(fn(&str) -> u64),
}

/// One shard: marks by key, and the keys in insertion order (each key once).
struct Shard {
    marks: HashMap<u64, u64, BuildHasherDefault<Mix>>,
    order: VecDeque<u64>,
}

/// The shard maps' hasher. Keys are already uniform 64-bit hashes, but every key of a
/// shard shares the bits that chose the shard; one multiplication spreads all bits into
/// the high bits the map's probe tags use.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.inner.capacity)
            .field("shards", &self.inner.shards.len())
            .field("floor", &self.floor())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store that keeps at most `capacity` resources' marks.
    pub fn new(capacity: u64) -> Self {
        Self::build(capacity, Keyer::Random(RandomState::new()))
    }

    fn build(capacity: u64, keyer: Keyer) -> Self {
        let wanted = (capacity / SHARD_SPAN).clamp(1, SHARDS_MAX as u64) as usize;
        // A power of two, so a key's shard is a mask of its bits.
        let shards = if wanted.is_power_of_two() {
            wanted
        } else {
            wanted.next_power_of_two() / 2
        };
        let shards = (0..shards)
            .map(|_| {
                RwLock::new(Shard {
                    marks: HashMap::default(),
                    order: VecDeque::new(),
                })
            })
            .collect();
        let inner = Inner {
            shards,
            floor: AtomicU64::new(0),
            keyer,
            capacity,
            kept: AtomicUsize::new(0),
        };
        MemoryStore {
            inner: Arc::new(inner),
        }
    }

    /// A store whose keys come from `key` instead of a random hash (to force collisions).
    #[cfg(test)]
    fn with_keys(capacity: u64, key: fn(&str) -> u64) -> Self {
        Self::build(capacity, Keyer::Fixed(key))
    }

    /// The floor: the largest mark evicted so far (the mark of every resource not kept).
    pub fn floor(&self) -> FencingToken {
        token(self.inner.floor.load(Ordering::SeqCst))
    }

    /// The number of marks kept now (at most the capacity).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| read(s).marks.len()).sum()
    }

    /// Whether no mark is kept (every resource is at the floor).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mark a raise would compare against now: the kept mark, or the floor.
    pub fn mark(&self, resource: &str) -> FencingToken {
        let (key, shard) = self.locate(resource);
        match read(shard).marks.get(&key) {
            Some(&m) => token(m),
            None => self.floor(),
        }
    }

    fn locate(&self, resource: &str) -> (u64, &RwLock<Shard>) {
        let key = match &self.inner.keyer {
            Keyer::Random(state) => state.hash_one(resource),
            #[cfg(test)]
            Keyer::Fixed(f) => f(resource),
        };
        let shards = &self.inner.shards;
        // The map inside the shard spreads the low bits; the shard takes bits 32 and up.
        (key, &shards[(key >> 32) as usize & (shards.len() - 1)])
    }

    /// The synchronous raise behind [`HighWaterStore::raise`]: linearizable per resource
    /// (all of a resource's raises take its shard's lock).
    pub fn raise_now(&self, resource: &str, t: FencingToken) -> Raise {
        let t = t.get();
        let (key, shard) = self.locate(resource);
        // Read lock: decides a token at or below the mark (no change to make).
        if let Some(&m) = read(shard).marks.get(&key) {
            if t < m {
                return Raise::Stale { highest: token(m) };
            }
            if t == m {
                return Raise::Admitted;
            }
        }
        let mut guard = shard.write().unwrap_or_else(PoisonError::into_inner);
        let s = &mut *guard;
        if let Some(m) = s.marks.get_mut(&key) {
            if t < *m {
                return Raise::Stale { highest: token(*m) };
            }
            *m = t;
            return Raise::Admitted;
        }
        // Not kept: the floor stands for its mark. Every eviction from this shard raised
        // the floor under this lock, so this read covers them.
        let floor = self.inner.floor.load(Ordering::SeqCst);
        if t < floor {
            return Raise::Stale {
                highest: token(floor),
            };
        }
        // Count the insert first: if that passes the capacity, this shard makes room
        // (one out, one in), or, holding nothing to evict, keeps nothing.
        let capacity = usize::try_from(self.inner.capacity).unwrap_or(usize::MAX);
        if self.inner.kept.fetch_add(1, Ordering::SeqCst) >= capacity {
            self.inner.kept.fetch_sub(1, Ordering::SeqCst);
            if !s.evict_one(&self.inner.floor) {
                self.inner.floor.fetch_max(t, Ordering::SeqCst);
                return Raise::Admitted;
            }
        }
        s.marks.insert(key, t);
        s.order.push_back(key);
        Raise::Admitted
    }
}

impl Shard {
    /// Evicts the lowest mark among the oldest [`SAMPLE`] entries into `floor`; false if
    /// the shard holds nothing.
    fn evict_one(&mut self, floor: &AtomicU64) -> bool {
        let mut seen = [0u64; SAMPLE];
        let mut n = 0;
        while n < SAMPLE {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            seen[n] = key;
            n += 1;
        }
        let mark = |key: &u64| self.marks.get(key).copied().unwrap_or(0);
        let Some(victim) = seen[..n].iter().copied().min_by_key(mark) else {
            // The queue holds every kept key; empty means the map is empty too.
            return false;
        };
        for &key in &seen[..n] {
            if key != victim {
                self.order.push_back(key);
            }
        }
        if let Some(m) = self.marks.remove(&victim) {
            floor.fetch_max(m, Ordering::SeqCst);
        }
        true
    }
}

fn read(shard: &RwLock<Shard>) -> std::sync::RwLockReadGuard<'_, Shard> {
    shard.read().unwrap_or_else(PoisonError::into_inner)
}

impl HighWaterStore for MemoryStore {
    fn raise(&self, resource: &str, token: FencingToken) -> RaiseFuture {
        Box::pin(std::future::ready(Ok(self.raise_now(resource, token))))
    }

    fn raise_ready(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Option<Result<Raise, StoreError>> {
        Some(Ok(self.raise_now(resource, token)))
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
        assert_eq!(
            store.raise_now("b", t(1)),
            Raise::Admitted,
            "marks are per resource"
        );
        assert_eq!(store.mark("a"), t(9));
        assert_eq!(store.floor(), t(0));
    }

    #[test]
    fn an_evicted_mark_becomes_the_floor_of_every_unknown_resource() {
        let store = MemoryStore::new(1);
        assert_eq!(store.raise_now("a", t(50)), Raise::Admitted);
        for i in 0..64 {
            store.raise_now(&format!("other{i}"), t(60 + i));
        }
        assert!(
            store.floor() >= t(50),
            "floor {} after evicting a's mark 50",
            store.floor()
        );
        // "a" may be gone; a token below its old mark must still be refused...
        assert!(
            matches!(store.raise_now("a", t(49)), Raise::Stale { highest } if highest >= t(50))
        );
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
                        assert!(
                            token >= admitted[r],
                            "{key}: admitted {token} after {}",
                            admitted[r]
                        );
                        admitted[r] = token;
                    }
                    Raise::Stale { highest } => {
                        assert!(
                            highest > t(token),
                            "{key}: refused {token} naming mark {highest}"
                        );
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
        assert_eq!(
            fresh_refused, 0,
            "a token above every earlier one was refused"
        );
        assert!(replays > 1_000, "replays were refused: {replays}");
        assert!(store.len() <= 100, "bounded: {}", store.len());
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
            }
        }
    }

    /// At capacity 4 (one shard) the fifth resource evicts the lowest of the four oldest
    /// marks into the floor, exactly; the evicted resource is then judged by the floor.
    #[test]
    fn a_full_store_evicts_its_lowest_old_mark_into_the_floor() {
        let store = MemoryStore::new(4);
        for (r, v) in [("a", 30), ("b", 10), ("c", 40), ("d", 20)] {
            assert_eq!(store.raise_now(r, t(v)), Raise::Admitted);
        }
        assert_eq!((store.len(), store.floor()), (4, t(0)));
        assert_eq!(store.raise_now("e", t(50)), Raise::Admitted);
        assert_eq!(store.len(), 4, "bounded");
        assert_eq!(store.floor(), t(10), "b (10) was the lowest mark");
        assert_eq!(store.mark("b"), t(10));
        assert_eq!(store.mark("a"), t(30), "a is kept");
        assert_eq!(store.raise_now("b", t(9)), Raise::Stale { highest: t(10) });
        // An unknown resource below the floor is refused (the documented cost)...
        assert_eq!(
            store.raise_now("never-seen", t(5)),
            Raise::Stale { highest: t(10) }
        );
        // ...and at the floor admitted again, which evicts d (20, the lowest left).
        assert_eq!(store.raise_now("b", t(10)), Raise::Admitted);
        assert_eq!((store.len(), store.floor()), (4, t(20)));
        assert_eq!(store.raise_now("d", t(19)), Raise::Stale { highest: t(20) });
        assert_eq!(
            store.raise_now("a", t(29)),
            Raise::Stale { highest: t(30) },
            "kept marks still decide"
        );
    }

    /// Capacity 0: nothing is kept, every admitted token goes to the floor.
    #[test]
    fn capacity_zero_keeps_only_the_floor() {
        let store = MemoryStore::new(0);
        assert_eq!(store.raise_now("a", t(7)), Raise::Admitted);
        assert!(store.is_empty());
        assert_eq!(store.floor(), t(7));
        assert_eq!(store.raise_now("b", t(6)), Raise::Stale { highest: t(7) });
        assert_eq!(store.raise_now("b", t(7)), Raise::Admitted);
    }

    /// A large store is sharded and still never holds more than its capacity.
    #[test]
    fn a_sharded_store_stays_within_its_capacity() {
        let store = MemoryStore::new(100_000);
        assert_eq!(store.inner.shards.len(), 64);
        for i in 0..100_000u64 {
            assert_eq!(
                store.raise_now(&format!("r{i}"), t(1_000_000 + i)),
                Raise::Admitted
            );
        }
        // Shards fill unevenly; the capacity is the store's, so nothing was evicted yet.
        assert_eq!((store.len(), store.floor()), (100_000, t(0)));
        for i in 0..100_000u64 {
            assert_eq!(
                store.raise_now(&format!("r{i}"), t(1_000_000 + i)),
                Raise::Admitted,
                "r{i} kept"
            );
        }
        for i in 100_000..150_000u64 {
            assert_eq!(
                store.raise_now(&format!("r{i}"), t(1_000_000 + i)),
                Raise::Admitted
            );
        }
        assert_eq!(store.len(), 100_000);
        // 50,000 evictions of old, low marks: the floor is one of them.
        assert!(
            store.floor() >= t(1_000_000) && store.floor() < t(1_150_000),
            "{}",
            store.floor()
        );
        let n = MemoryStore::new(3_000).inner.shards.len();
        assert_eq!(
            n, 2,
            "3,000 resources: the largest power of two at or below 3,000 / 1,024"
        );
    }

    proptest::proptest! {
        /// Resources `r0`..`r7` hashed into four keys (pairs collide): every token an
        /// exact map of marks would refuse is refused, a refusal names a mark above the
        /// token, and an admitted token is never below its own resource's last admitted
        /// one. (The store may refuse more: the merged mark.)
        #[test]
        fn collisions_can_only_refuse(ops in proptest::collection::vec((0u8..8, 0u64..40), 1..200)) {
            use std::collections::HashMap;
            fn pair(r: &str) -> u64 {
                r[1..].parse::<u64>().unwrap() / 2
            }
            let store = MemoryStore::with_keys(1_000, pair);
            let mut exact: HashMap<u8, u64> = HashMap::new();
            for (r, v) in ops {
                let key = format!("r{r}");
                let exact_admits = exact.get(&r).is_none_or(|&m| v >= m);
                match store.raise_now(&key, t(v)) {
                    Raise::Admitted => {
                        proptest::prop_assert!(exact_admits, "{} admitted {} below its mark {:?}", key, v, exact.get(&r));
                        exact.insert(r, v);
                    }
                    Raise::Stale { highest } => {
                        proptest::prop_assert!(highest > t(v));
                        if exact_admits {
                            // Refused only because the other resource of the pair is higher.
                            let other = exact.get(&(r ^ 1)).copied().unwrap_or(0);
                            proptest::prop_assert!(other > v, "{} refused {} with no higher mark in its pair", key, v);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn colliding_resources_share_the_higher_mark() {
        let store = MemoryStore::with_keys(10, |_| 42);
        assert_eq!(store.raise_now("a", t(10)), Raise::Admitted);
        assert_eq!(
            store.raise_now("b", t(5)),
            Raise::Stale { highest: t(10) },
            "b shares a's mark"
        );
        assert_eq!(store.raise_now("b", t(12)), Raise::Admitted);
        assert_eq!(store.raise_now("a", t(11)), Raise::Stale { highest: t(12) });
        assert_eq!(store.len(), 1);
    }
}
