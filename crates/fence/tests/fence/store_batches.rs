//! PostgresStore's batches: concurrent raises sent together, each with its own verdict.

use std::collections::HashMap;
use std::sync::Arc;

use palisade_fence::{BatchCounts, FencingToken, HighWaterStore, PostgresStore, Raise};
use tokio_postgres::error::SqlState;

use crate::common::{pool, shuffle, tok};
use crate::postgres_helper::{fresh_db, mark};

/// Raises tokens 1..=40 of eight resources all at once, in a shuffled order, and checks
/// every verdict against the marks left behind: the highest token of each resource is
/// admitted and is its mark; every refusal names a mark above its token, no higher than
/// the resource's highest token; every token above the mark was admitted.
pub(crate) async fn check_concurrent_raises(
    store: &PostgresStore,
    direct: &tokio_postgres::Client,
) {
    let mut asks: Vec<(String, FencingToken)> = (0..8)
        .flat_map(|r| (1..=40).map(move |t| (format!("batch/{r}"), tok(t))))
        .collect();
    shuffle(&mut asks, 7);
    let tasks: Vec<_> = asks
        .iter()
        .cloned()
        .map(|(resource, token)| {
            let store = store.clone();
            tokio::spawn(async move {
                let verdict = store.raise(&resource, token).await;
                (resource, token, verdict)
            })
        })
        .collect();
    let mut admitted: HashMap<String, Vec<FencingToken>> = HashMap::new();
    for task in tasks {
        let (resource, token, verdict) = task.await.unwrap();
        match verdict.unwrap_or_else(|e| panic!("{resource} {token}: {e:?}")) {
            Raise::Admitted => admitted.entry(resource).or_default().push(token),
            Raise::Stale { highest } => {
                assert!(highest > token, "{resource}: {token} refused by {highest}");
                assert!(
                    highest <= tok(40),
                    "{resource}: a mark no one raised: {highest}"
                );
            }
        }
    }
    for r in 0..8 {
        let resource = format!("batch/{r}");
        assert_eq!(mark(direct, &resource).await, Some(tok(40)));
        assert!(admitted[&resource].contains(&tok(40)), "{resource}");
    }
}

#[tokio::test]
async fn a_store_on_one_connection_decides_concurrent_raises_in_batches() {
    let (db, client) = fresh_db().await;
    let store = PostgresStore::new(Arc::new(db.connect().await)).with_max_batch(16);
    check_concurrent_raises(&store, &client).await;
}

#[tokio::test]
async fn a_store_on_a_pool_decides_concurrent_raises_in_batches() {
    let (db, client) = fresh_db().await;
    let pool = pool(db.config(), 3);
    check_concurrent_raises(&PostgresStore::from_pool(pool), &client).await;
}

/// The queue task ends with the last clone of its store: the client it sent batches on
/// is held by no one else afterwards.
#[tokio::test]
async fn the_queue_task_ends_when_the_last_clone_of_the_store_is_dropped() {
    let (db, _client) = fresh_db().await;
    let client = Arc::new(db.connect().await);
    let store = PostgresStore::new(Arc::clone(&client)).with_prepared_statements();
    let clone = store.clone();
    assert_eq!(clone.raise("r", tok(1)).await.unwrap(), Raise::Admitted);
    drop(store);
    assert_eq!(clone.raise("r", tok(1)).await.unwrap(), Raise::Admitted);
    drop(clone);
    for _ in 0..100 {
        if Arc::strong_count(&client) == 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "the store's client is still held {} times",
        Arc::strong_count(&client) - 1
    );
}

/// Named statements, prepared once per connection, decide as the unnamed ones do, on one
/// connection and on a pool. (That they are named shows behind a transaction-mode
/// pooler, where they fail: see the pooler tests.)
#[tokio::test]
async fn stores_with_prepared_statements_decide_concurrent_raises_as_unnamed_ones_do() {
    let (db, client) = fresh_db().await;
    let single = PostgresStore::new(Arc::new(db.connect().await))
        .with_max_batch(16)
        .with_prepared_statements();
    check_concurrent_raises(&single, &client).await;
    assert_eq!(
        single.raise("batch/0", tok(39)).await.unwrap(),
        Raise::Stale { highest: tok(40) }
    );
    assert_eq!(
        single.raise("alone", tok(3)).await.unwrap(),
        Raise::Admitted
    );

    let (db, client) = fresh_db().await;
    let pool = pool(db.config(), 3);
    let pooled = PostgresStore::from_pool(pool).with_prepared_statements();
    check_concurrent_raises(&pooled, &client).await;
    assert_eq!(
        pooled.raise("alone", tok(3)).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        pooled.raise("alone", tok(2)).await.unwrap(),
        Raise::Stale { highest: tok(3) }
    );
}

/// Raises queued by tasks that run one after another on one worker (as a server's
/// requests do) go in one batch, not one each: the queue task, woken by the first raise,
/// lets the other runnable tasks queue theirs before it cuts the batch. Before it did,
/// each of the pool's free connections took a batch of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn raises_queued_by_tasks_runnable_together_share_one_round_trip() {
    let (db, client) = fresh_db().await;
    let pool = pool(db.config(), 4);
    let store = PostgresStore::from_pool(pool);
    // The queue task and a first connection, started.
    assert_eq!(store.raise("warm", tok(1)).await.unwrap(), Raise::Admitted);
    assert_eq!(
        store.batch_counts(),
        BatchCounts {
            batches: 1,
            raises: 1
        }
    );

    // One task on the worker spawns the 32 raisers, which run after it, one at a time.
    let spawner = store.clone();
    let verdicts = tokio::spawn(async move {
        let raisers: Vec<_> = (0..32)
            .map(|r| {
                let store = spawner.clone();
                tokio::spawn(async move { store.raise(&format!("together/{r}"), tok(5)).await })
            })
            .collect();
        let mut verdicts = Vec::new();
        for raiser in raisers {
            verdicts.push(raiser.await.unwrap().unwrap());
        }
        verdicts
    })
    .await
    .unwrap();
    assert_eq!(verdicts, vec![Raise::Admitted; 32]);
    let counts = store.batch_counts();
    assert_eq!(counts.raises, 33, "{counts:?}");
    // One batch; two when the runtime's periodic maintenance wakes the queue task
    // midway through the raisers (it looks at its I/O and timers every 61 tasks polled).
    assert!(
        counts.batches <= 3,
        "32 raises in {} batches",
        counts.batches - 1
    );
    for r in 0..32 {
        assert_eq!(mark(&client, &format!("together/{r}")).await, Some(tok(5)));
    }
}

/// `fence_raise_many` answers what `fence_raise` would for each element, in the order
/// given, and refuses arrays it cannot pair.
#[tokio::test]
async fn fence_raise_many_answers_each_element_like_fence_raise() {
    let (_db, client) = fresh_db().await;
    client
        .batch_execute("SELECT palisade_fence.fence_raise('b', 20)")
        .await
        .unwrap();
    let marks: Vec<Option<i64>> = client
        .query_one(
            "SELECT palisade_fence.fence_raise_many(ARRAY['a', 'b', 'c', 'd'], ARRAY[5, 10, 7, 0]::bigint[])",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(marks, vec![Some(5), Some(20), Some(7), Some(0)]);
    assert_eq!(
        mark(&client, "a").await,
        Some(FencingToken::from_u64(5).unwrap())
    );
    assert_eq!(
        mark(&client, "b").await,
        Some(FencingToken::from_u64(20).unwrap())
    );
    empty_and_unpaired_arrays(&client, "palisade_fence.fence_raise_many").await;
}

/// `fence_decide_many` (what the store sends) answers each element as the store decides:
/// a token at or below the committed mark gets that mark from the read alone, without
/// waiting for a raise in flight; a newer token, or a resource's first, is raised. It
/// reads the schema's mark table whatever the caller's search_path holds, and refuses
/// arrays it cannot pair.
#[tokio::test]
async fn fence_decide_many_answers_as_the_store_decides_without_waiting_on_equal_tokens() {
    let (db, client) = fresh_db().await;
    client
        .batch_execute("SELECT palisade_fence.fence_raise('b', 20)")
        .await
        .unwrap();
    // A raise of `b` in flight: it holds b's lock exclusive until it commits.
    let other = db.connect().await;
    other
        .batch_execute("BEGIN; SELECT palisade_fence.fence_raise('b', 30)")
        .await
        .unwrap();
    client
        .batch_execute("SET statement_timeout = '3s'")
        .await
        .unwrap();
    let marks: Vec<Option<i64>> = client
        .query_one(
            "SELECT palisade_fence.fence_decide_many(ARRAY['a', 'b', 'c'], ARRAY[5, 20, 0]::bigint[])",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(marks, vec![Some(5), Some(20), Some(0)]);
    let below: i64 = client
        .query_one("SELECT palisade_fence.fence_decide('b', 19)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(below, 20);
    // fence_raise, for use inside a transaction, waits for the raise in flight instead.
    let waits = client
        .query_one("SELECT palisade_fence.fence_raise('b', 20)", &[])
        .await
        .unwrap_err();
    assert_eq!(waits.code(), Some(&SqlState::QUERY_CANCELED), "{waits}");
    other.batch_execute("COMMIT").await.unwrap();
    let after: Vec<Option<i64>> = client
        .query_one(
            "SELECT palisade_fence.fence_decide_many(ARRAY['b', 'a'], ARRAY[20, 6]::bigint[])",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, vec![Some(30), Some(6)]);

    // A temporary table of the same name, searched first, is not read.
    client
        .batch_execute(
            "CREATE TEMP TABLE fence_high_water (resource text PRIMARY KEY, token bigint); \
             INSERT INTO pg_temp.fence_high_water VALUES ('a', 1000)",
        )
        .await
        .unwrap();
    let raised: i64 = client
        .query_one("SELECT palisade_fence.fence_decide('a', 7)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(raised, 7);
    let stored: i64 = client
        .query_one(
            "SELECT token FROM palisade_fence.fence_high_water WHERE resource = 'a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 7);

    empty_and_unpaired_arrays(&client, "palisade_fence.fence_decide_many").await;
}

/// `function` (of two arrays) answers empty arrays with an empty one, and refuses arrays of
/// different lengths, with a NULL element, or NULL, with SQLSTATE 22004.
async fn empty_and_unpaired_arrays(client: &tokio_postgres::Client, function: &str) {
    let empty: Vec<Option<i64>> = client
        .query_one(
            &format!("SELECT {function}('{{}}'::text[], '{{}}'::bigint[])"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(empty.is_empty(), "{function}");
    for args in [
        "ARRAY['a', 'b'], ARRAY[1]::bigint[]",
        "ARRAY['a', NULL], ARRAY[1, 2]::bigint[]",
        "ARRAY['a'], NULL::bigint[]",
    ] {
        let bad = format!("SELECT {function}({args})");
        let e = client.query_one(&bad, &[]).await.unwrap_err();
        assert_eq!(e.code(), Some(&SqlState::NULL_VALUE_NOT_ALLOWED), "{bad}");
    }
}
