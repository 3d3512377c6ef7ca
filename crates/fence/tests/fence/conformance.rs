//! One conformance suite for every high-water store: the same test code, one line per
//! store at the bottom of this file.
//!
//! A store gets the suite by implementing [`Fixture`] (how to make one on a fresh
//! backend, and, for a durable store, how to reset a mark and how to reach a backend that
//! is down) and adding a line to the `conformance!` list. The raise checks
//! ([`raises`]) hold for every store; the durable checks ([`durable`]) for the stores that
//! keep marks outside the process: shared by every store on one backend, resets recorded,
//! and a backend that does not answer fails closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::{Method, StatusCode};
use palisade_fence::{
    Epoch, FenceLayer, FencingToken, HighWaterStore, MarkReset, Raise, Revision, StoreError,
};

use crate::common::{client, send, serve, shuffle};

/// How a test makes a store of one kind on a backend of its own.
pub(crate) trait Fixture: Sized + Send + Sync + 'static {
    /// The store under test.
    type Store: HighWaterStore + Clone;

    /// A fresh backend (an empty database, a key prefix of its own, ...).
    async fn up() -> Self;

    /// A store on this fixture's backend. For a durable store every call gives a new
    /// one (a new pool or connection), as another replica would have; an in-process store
    /// gives the same one.
    async fn store(&self) -> Self::Store;
}

/// What only a durable store has: resets, and a backend that can be down.
pub(crate) trait Durable: Fixture {
    /// Lowers `resource`'s mark to `to` through the store's own reset (unchecked by a
    /// lock: `ResetGuard::LockUnknown`); returns the mark it replaced, or the store's
    /// error as text with its kind: `Err((Refusal::BadReset | NoMark, text))`.
    async fn reset(
        &self,
        resource: &str,
        to: FencingToken,
        reason: &str,
    ) -> Result<FencingToken, (Refusal, String)>;

    /// The last `limit` resets of `resource`, newest first, as the store logged them.
    async fn resets(&self, resource: &str, limit: usize) -> Vec<MarkReset>;

    /// A store of this kind whose backend does not answer (a closed port).
    async fn unreachable() -> Self::Store;
}

/// Why a reset was refused, as the store's typed error says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// An empty reason, or a token not below the mark.
    BadReset,
    /// The resource has no mark.
    NoMark,
    /// Anything else (a failure, not a refusal).
    Other,
}

/// A token in epoch 1 (revision `rev`).
fn tok(rev: u64) -> FencingToken {
    FencingToken::from_parts(Epoch::new(1).unwrap(), Revision::new(rev)).unwrap()
}

/// A token of a late epoch: above 2^53, where a double cannot tell `rev` from `rev + 1`.
fn big(rev: u64) -> FencingToken {
    FencingToken::from_parts(Epoch::new(20_000).unwrap(), Revision::new(rev)).unwrap()
}

/// The mark, read by raising the lowest token (refused with the mark unless there is
/// none; then `None`, and the lowest token is the mark from now on).
async fn probe(store: &impl HighWaterStore, resource: &str) -> Option<FencingToken> {
    match store.raise(resource, FencingToken::MIN).await.unwrap() {
        Raise::Stale { highest } => Some(highest),
        Raise::Admitted => None,
    }
}

/// Resource names a store must keep apart and intact: separators, spaces, non-ASCII,
/// and the characters Redis reads as a hash tag.
const NAMES: [&str; 5] = [
    "orders/1",
    "orders/1/",
    "a b\tc",
    "ünïcödé/日本",
    "{tag}/x}{",
];

pub(crate) mod raises {
    use super::*;

    /// A resource's first raise is admitted, whatever its token (the lowest, one of a late
    /// epoch); the next resource is untouched by it.
    pub(crate) async fn first_raise_is_admitted<F: Fixture>() {
        let f = F::up().await;
        let s = f.store().await;
        assert_eq!(s.raise("first/a", tok(7)).await.unwrap(), Raise::Admitted);
        assert_eq!(s.raise("first/b", big(9)).await.unwrap(), Raise::Admitted);
        assert_eq!(
            s.raise("first/c", FencingToken::MIN).await.unwrap(),
            Raise::Admitted
        );
        assert_eq!(probe(&s, "first/a").await, Some(tok(7)));
        assert_eq!(probe(&s, "first/b").await, Some(big(9)));
        assert_eq!(probe(&s, "first/d").await, None);
    }

    /// An equal token is admitted (a holder writes again under one hold); a lower one is
    /// refused with the mark, which it leaves unchanged; a higher one raises it. Late-epoch
    /// tokens one apart are told apart.
    pub(crate) async fn equal_admitted_lower_refused_with_the_mark<F: Fixture>() {
        let f = F::up().await;
        let s = f.store().await;
        for (resource, low, mid, high) in [
            ("eq/small", tok(5), tok(6), tok(7)),
            (
                "eq/big",
                big(1 << 40),
                big((1 << 40) + 1),
                big((1 << 40) + 2),
            ),
        ] {
            assert_eq!(s.raise(resource, mid).await.unwrap(), Raise::Admitted);
            assert_eq!(s.raise(resource, mid).await.unwrap(), Raise::Admitted);
            assert_eq!(
                s.raise(resource, low).await.unwrap(),
                Raise::Stale { highest: mid },
                "{resource}"
            );
            assert_eq!(s.raise(resource, high).await.unwrap(), Raise::Admitted);
            assert_eq!(
                s.raise(resource, mid).await.unwrap(),
                Raise::Stale { highest: high },
                "{resource}"
            );
        }
        assert_eq!(
            s.raise("eq/max", FencingToken::MAX).await.unwrap(),
            Raise::Admitted
        );
        assert_eq!(
            s.raise("eq/max", big(3)).await.unwrap(),
            Raise::Stale {
                highest: FencingToken::MAX
            }
        );
    }

    /// Names that differ only in separators, spaces or hash-tag braces have marks of their
    /// own, and each keeps its exact name.
    pub(crate) async fn names_keep_their_own_marks<F: Fixture>() {
        let f = F::up().await;
        let s = f.store().await;
        for (i, name) in NAMES.iter().enumerate() {
            let t = tok(100 + i as u64);
            assert_eq!(s.raise(name, t).await.unwrap(), Raise::Admitted, "{name:?}");
        }
        for (i, name) in NAMES.iter().enumerate() {
            assert_eq!(probe(&s, name).await, Some(tok(100 + i as u64)), "{name:?}");
        }
    }

    /// Many tasks raise random tokens of a few resources at once. The mark only rises:
    /// the final mark is the highest token raised; every refusal names a mark above its
    /// token that some raise brought; and no admitted raise was below a mark that a raise
    /// completed before it started had left (the store is linearizable per resource).
    pub(crate) async fn marks_only_rise_under_concurrent_raises<F: Fixture>() {
        let f = F::up().await;
        let s = f.store().await;
        const RESOURCES: usize = 3;
        const TASKS: usize = 12;
        const EACH: usize = 40;
        let epoch = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut plan: Vec<(usize, u64)> = (0..EACH)
                    .map(|i| (i % RESOURCES, 1 + ((t * EACH + i) as u64 * 7919) % 997))
                    .collect();
                shuffle(&mut plan, t as u64 + 1);
                let mut done = Vec::with_capacity(EACH);
                for (r, rev) in plan {
                    let resource = format!("rise/{r}");
                    let start = epoch.elapsed();
                    let verdict = s.raise(&resource, tok(rev)).await.unwrap();
                    done.push((r, tok(rev), verdict, start, epoch.elapsed()));
                }
                done
            }));
        }
        let mut ops = Vec::new();
        for task in tasks {
            ops.extend(task.await.unwrap());
        }
        let mut raised: HashMap<usize, Vec<FencingToken>> = HashMap::new();
        for (r, token, ..) in &ops {
            raised.entry(*r).or_default().push(*token);
        }
        for (r, tokens) in &raised {
            let max = *tokens.iter().max().unwrap();
            assert_eq!(probe(&s, &format!("rise/{r}")).await, Some(max), "rise/{r}");
        }
        for (r, token, verdict, start, _) in &ops {
            // The mark any raise of this resource left that completed before this one
            // started: this raise may not be admitted below it.
            let floor = ops
                .iter()
                .filter(|(r2, .., end2)| r2 == r && end2 < start)
                .map(|(_, t2, v2, ..)| match v2 {
                    Raise::Admitted => *t2,
                    Raise::Stale { highest } => *highest,
                })
                .max();
            match verdict {
                Raise::Admitted => assert!(
                    floor.is_none_or(|floor| *token >= floor),
                    "rise/{r}: {token} admitted after a completed raise left {floor:?}"
                ),
                Raise::Stale { highest } => {
                    assert!(highest > token, "rise/{r}: {token} refused by {highest}");
                    assert!(
                        raised[r].contains(highest),
                        "rise/{r}: refused by {highest}, which no raise brought"
                    );
                }
            }
        }
    }
}

pub(crate) mod durable {
    use super::*;

    /// Two stores on one backend (two replicas) give the same verdicts: a mark raised
    /// through one refuses a lower token through the other.
    pub(crate) async fn marks_are_shared_by_stores_on_one_backend<F: Durable>() {
        let f = F::up().await;
        let (a, b) = (f.store().await, f.store().await);
        assert_eq!(a.raise("shared/1", tok(20)).await.unwrap(), Raise::Admitted);
        assert_eq!(
            b.raise("shared/1", tok(19)).await.unwrap(),
            Raise::Stale { highest: tok(20) }
        );
        assert_eq!(b.raise("shared/1", tok(21)).await.unwrap(), Raise::Admitted);
        assert_eq!(
            a.raise("shared/1", tok(20)).await.unwrap(),
            Raise::Stale { highest: tok(21) }
        );
    }

    /// A reset lowers a mark to the token named, is logged with its reason and the marks
    /// before and after, and is refused when it would not lower (or has no reason, or no
    /// mark to lower), leaving the mark as it was.
    pub(crate) async fn a_reset_is_recorded<F: Durable>() {
        let f = F::up().await;
        let s = f.store().await;
        assert_eq!(s.raise("reset/1", tok(50)).await.unwrap(), Raise::Admitted);
        assert_eq!(
            f.reset("reset/1", tok(20), "poisoned by a test token")
                .await,
            Ok(tok(50))
        );
        let store = f.store().await;
        assert_eq!(
            store.raise("reset/1", tok(19)).await.unwrap(),
            Raise::Stale { highest: tok(20) }
        );
        assert_eq!(
            store.raise("reset/1", tok(20)).await.unwrap(),
            Raise::Admitted
        );
        let log = f.resets("reset/1", 5).await;
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!((log[0].old, log[0].new), (tok(50), tok(20)));
        assert_eq!(log[0].reason, "poisoned by a test token");
        assert!(!log[0].reset_by.is_empty(), "{log:?}");
        assert_eq!(log[0].lock, None);

        let refused = |r: Result<FencingToken, (Refusal, String)>| r.map_err(|(kind, _)| kind);
        assert_eq!(
            refused(f.reset("reset/1", tok(30), "up is not a reset").await),
            Err(Refusal::BadReset)
        );
        assert_eq!(
            refused(f.reset("reset/1", tok(20), "equal is not lower").await),
            Err(Refusal::BadReset)
        );
        assert_eq!(
            refused(f.reset("reset/1", tok(10), "").await),
            Err(Refusal::BadReset)
        );
        assert_eq!(
            refused(f.reset("reset/none", tok(1), "nothing to lower").await),
            Err(Refusal::NoMark)
        );
        assert_eq!(probe(&s, "reset/1").await, Some(tok(20)));
        assert_eq!(f.resets("reset/1", 5).await.len(), 1);
    }

    /// A store whose backend does not answer fails closed: a typed, retryable error,
    /// never an admit; behind the fence layer a fenced write gets 503 and never reaches
    /// the service.
    pub(crate) async fn a_store_that_is_down_fails_closed<F: Durable>() {
        let store = F::unreachable().await;
        let err: StoreError = store
            .raise("down/1", tok(1))
            .await
            .expect_err("a store that cannot be reached admitted a raise");
        assert!(err.is_retryable(), "{err:?}");

        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&calls);
        let app = axum::Router::new()
            .route(
                "/{*path}",
                axum::routing::put(move || {
                    seen.fetch_add(1, Ordering::SeqCst);
                    async { "written" }
                }),
            )
            .layer(FenceLayer::new(store));
        let addr = serve(app).await;
        let r = send(
            &client(),
            Method::PUT,
            addr,
            "/down/1",
            &[&tok(1).to_string()],
        )
        .await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        let body = String::from_utf8_lossy(&r.body);
        assert!(body.contains("store-unavailable"), "{body}");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}

/// The suite for one store: `conformance!(module: Fixture, raises)` for a store that
/// keeps marks in the process, `conformance!(module: Fixture, durable)` for one that also
/// passes the durable checks.
macro_rules! conformance {
    (@raises $f:ty) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn first_raise_is_admitted() {
            $crate::conformance::raises::first_raise_is_admitted::<$f>().await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn equal_admitted_lower_refused_with_the_mark() {
            $crate::conformance::raises::equal_admitted_lower_refused_with_the_mark::<$f>().await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn names_keep_their_own_marks() {
            $crate::conformance::raises::names_keep_their_own_marks::<$f>().await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn marks_only_rise_under_concurrent_raises() {
            $crate::conformance::raises::marks_only_rise_under_concurrent_raises::<$f>().await
        }
    };
    ($name:ident: $f:ty, raises) => {
        mod $name {
            #[allow(unused_imports)]
            use super::fixtures;
            conformance!(@raises $f);
        }
    };
    ($name:ident: $f:ty, durable) => {
        mod $name {
            #[allow(unused_imports)]
            use super::fixtures;
            conformance!(@raises $f);
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn marks_are_shared_by_stores_on_one_backend() {
                $crate::conformance::durable::marks_are_shared_by_stores_on_one_backend::<$f>()
                    .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_reset_is_recorded() {
                $crate::conformance::durable::a_reset_is_recorded::<$f>().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_store_that_is_down_fails_closed() {
                $crate::conformance::durable::a_store_that_is_down_fails_closed::<$f>().await
            }
        }
    };
}

mod fixtures;

conformance!(memory: fixtures::Memory, raises);
conformance!(postgres: fixtures::Postgres, durable);
conformance!(redis: fixtures::Redis, durable);
conformance!(mysql: fixtures::Mysql, durable);
