//! The Postgres conditional-write helper and PostgresStore, on a real database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{
    begin_fenced, fenced_transaction, migrate, FenceError, FenceErrorKind, FencedUpdate,
    FencingToken, HighWaterStore, PostgresStore, Raise,
};
use palisade_testkit::TestDb;
use tokio_postgres::error::SqlState;

use crate::common::{pause, shuffle, stagger, tok};

pub(crate) async fn fresh_db() -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    migrate(&mut client).await.unwrap();
    migrate(&mut client).await.unwrap(); // idempotent
    (db, client)
}

pub(crate) async fn mark(client: &tokio_postgres::Client, resource: &str) -> Option<FencingToken> {
    client
        .query_opt(
            "SELECT token FROM palisade_fence.fence_high_water WHERE resource = $1",
            &[&resource],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// The write log of the ordering tests: `seq` is taken inside the fenced transaction,
/// while it holds the resource's row lock until commit, so `seq` order is commit order.
pub(crate) const LOG_TABLE: &str = "CREATE SEQUENCE log_seq; \
     CREATE TABLE write_log (seq bigint PRIMARY KEY DEFAULT nextval('log_seq'), token bigint NOT NULL, \
     txid xid8 NOT NULL DEFAULT pg_current_xact_id())";

/// Checks the log against the admitted tokens: commit order never decreases, one row
/// per admitted writer and none from a refused one.
pub(crate) async fn check_log(client: &tokio_postgres::Client, admitted: &[FencingToken]) {
    let logged: Vec<FencingToken> = client
        .query("SELECT token FROM write_log ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        logged.windows(2).all(|w| w[0] <= w[1]),
        "commit order decreased: {logged:?}"
    );
    let mut a = admitted.to_vec();
    a.sort();
    let mut l = logged.clone();
    l.sort();
    assert_eq!(l, a, "log rows are exactly the admitted writers");
    let txids: i64 = client
        .query_one("SELECT count(DISTINCT txid) FROM write_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        txids as usize,
        admitted.len(),
        "one transaction per admitted writer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_writers_commit_in_token_order() {
    let (db, client) = fresh_db().await;
    client.batch_execute(LOG_TABLE).await.unwrap();
    // Rounds 0 and 1: everyone at once. Rounds 2 and 3: staggered, so more commit.
    for round in 0..4u64 {
        client
            .batch_execute("TRUNCATE write_log; DELETE FROM palisade_fence.fence_high_water")
            .await
            .unwrap();
        let mut tokens: Vec<FencingToken> = (0..32).map(|i| tok(1_000 + 7 * i + round)).collect();
        shuffle(&mut tokens, 0xfeed + round);
        let barrier = Arc::new(tokio::sync::Barrier::new(tokens.len()));
        let mut tasks = Vec::new();
        for &token in &tokens {
            let mut c = db.connect().await;
            let barrier = Arc::clone(&barrier);
            let delay = if round >= 2 {
                stagger(&tokens, token, 3, round)
            } else {
                Duration::ZERO
            };
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                tokio::time::sleep(delay).await;
                let r = fenced_transaction(&mut c, "account/1", token, |tx| {
                    Box::pin(async move {
                        // Sleep between the check and the write, 0-6 ms by token: the window a
                        // non-atomic check would lose.
                        tx.execute("SELECT pg_sleep($1)", &[&pause(token)]).await?;
                        tx.execute("INSERT INTO write_log (token) VALUES ($1)", &[&token])
                            .await?;
                        Ok::<_, FenceError>(())
                    })
                })
                .await;
                (token, r)
            }));
        }
        let mut admitted = Vec::new();
        let mut refused = 0;
        for t in tasks {
            let (token, r) = t.await.unwrap();
            match r {
                Ok(()) => admitted.push(token),
                Err(e) => {
                    assert!(e.is_stale(), "{e:?}");
                    assert_eq!(e.token(), Some(token));
                    assert!(
                        e.highest().unwrap() > token,
                        "refused {token} naming {:?}",
                        e.highest()
                    );
                    assert!(!e.is_retryable());
                    refused += 1;
                }
            }
        }
        assert_eq!(admitted.len() + refused, 32);
        eprintln!(
            "round {round}: admitted {} refused {refused}",
            admitted.len()
        );
        check_log(&client, &admitted).await;
        let max = *tokens.iter().max().unwrap();
        assert!(
            admitted.contains(&max),
            "the largest token is always admitted"
        );
        assert_eq!(
            mark(&client, "account/1").await,
            Some(max),
            "final mark is the largest admitted"
        );
    }
}

/// Lock requests on the database that are waiting.
async fn waiting_locks(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
        .await
        .unwrap()
        .get(0)
}

/// Waits (up to 2 s) until `n` lock requests wait.
pub(crate) async fn until_waiting(admin: &tokio_postgres::Client, n: i64) {
    for _ in 0..100 {
        if waiting_locks(admin).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fewer than {n} lock requests ever waited");
}

#[tokio::test]
async fn a_stale_token_rolls_back_before_the_body_runs() {
    let (_db, mut client) = fresh_db().await;
    fenced_transaction(&mut client, "r", tok(10), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let err = fenced_transaction(&mut client, "r", tok(5), move |_| {
        Box::pin(async move {
            flag.store(true, Ordering::SeqCst);
            Ok::<_, FenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body ran for a stale token"
    );
    assert_eq!(err.kind(), FenceErrorKind::Stale);
    assert_eq!((err.token(), err.highest()), (Some(tok(5)), Some(tok(10))));
    assert!(err.code().is_none());
    assert_eq!(
        err.to_string(),
        format!(
            "stale fencing token {}: the resource has seen {}",
            tok(5),
            tok(10)
        )
    );
    // Equal is admitted; the connection is usable (the stale transaction was closed).
    fenced_transaction(&mut client, "r", tok(10), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    assert_eq!(mark(&client, "r").await, Some(tok(10)));
}

#[tokio::test]
async fn a_failing_body_rolls_back_its_writes_and_the_raise() {
    let (_db, mut client) = fresh_db().await;
    client
        .batch_execute("CREATE TABLE t (x bigint)")
        .await
        .unwrap();
    fenced_transaction(&mut client, "r", tok(10), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    let err = fenced_transaction(&mut client, "r", tok(20), |tx| {
        Box::pin(async move {
            tx.execute("INSERT INTO t VALUES (1)", &[]).await?;
            tx.execute("INSERT INTO no_such_table VALUES (1)", &[])
                .await?;
            Ok::<_, FenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert_eq!(err.kind(), FenceErrorKind::Database);
    assert_eq!(err.code(), Some(&SqlState::UNDEFINED_TABLE));
    assert!(std::error::Error::source(&err).is_some());
    let n: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    assert_eq!(
        mark(&client, "r").await,
        Some(tok(10)),
        "the raise rolled back with the body"
    );
}

#[tokio::test]
async fn begin_fenced_holds_the_row_lock_until_commit() {
    let (db, mut a) = fresh_db().await;
    let mut b = db.connect().await;
    let tx = begin_fenced(&mut a, "r", tok(7)).await.unwrap();
    let waiter = tokio::spawn(async move {
        let r = begin_fenced(&mut b, "r", tok(6)).await.map(|_| ());
        r.map_err(|e| (e.kind(), e.highest()))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the second writer must wait for the first to commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        waiter.await.unwrap(),
        Err((FenceErrorKind::Stale, Some(tok(7))))
    );
}

#[tokio::test]
async fn a_concurrent_raise_at_repeatable_read_is_a_retryable_serialization_failure() {
    let (db, mut a) = fresh_db().await;
    let mut b = db.connect().await;
    fenced_transaction(&mut a, "r", tok(1), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    b.batch_execute("SET default_transaction_isolation = 'repeatable read'")
        .await
        .unwrap();
    let tx = begin_fenced(&mut a, "r", tok(5)).await.unwrap();
    let waiter = tokio::spawn(async move { begin_fenced(&mut b, "r", tok(6)).await.map(|_| ()) });
    // Wait until b is blocked on a's lock, then commit a.
    let admin = db.connect().await;
    until_waiting(&admin, 1).await;
    tx.commit().await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), FenceErrorKind::SerializationFailure, "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE));
}

#[tokio::test]
async fn folded_update_tells_row_missing_from_stale() {
    let (_db, client) = fresh_db().await;
    client
        .batch_execute(
            "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint); \
             INSERT INTO accounts VALUES (1, 0, NULL)",
        )
        .await
        .unwrap();
    let accounts = FencedUpdate::new("accounts", "id");
    let add = |amount: i64, token: FencingToken, id: i64| {
        let accounts = accounts.clone();
        let client = &client;
        async move {
            accounts
                .execute(client, &id, "balance = balance + $3", &[&amount], token)
                .await
        }
    };
    assert_eq!(
        add(100, tok(5), 1).await.unwrap(),
        1,
        "a never-fenced row (NULL) is admitted"
    );
    assert_eq!(
        add(10, tok(5), 1).await.unwrap(),
        1,
        "an equal token is admitted"
    );
    let stale = add(1_000, tok(4), 1).await.unwrap_err();
    assert_eq!(stale.kind(), FenceErrorKind::Stale);
    assert_eq!(
        (stale.token(), stale.highest()),
        (Some(tok(4)), Some(tok(5)))
    );
    let missing = add(1, tok(9), 2).await.unwrap_err();
    assert!(missing.is_row_missing() && !missing.is_stale() && !missing.is_retryable());
    assert_eq!(add(1, tok(9), 1).await.unwrap(), 1);
    let row = client
        .query_one(
            "SELECT balance, fence_token FROM accounts WHERE id = 1",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, FencingToken>(1)),
        (111, tok(9))
    );
    assert_eq!(
        FencedUpdate::new("s.accounts", "id")
            .with_token_column("tok")
            .sql("x = $3"),
        "UPDATE s.accounts SET x = $3, tok = $1 WHERE id = $2 AND (tok IS NULL OR tok <= $1)"
    );
}

#[test]
#[should_panic(expected = "not a plain SQL identifier")]
fn folded_update_refuses_a_non_identifier() {
    let _ = FencedUpdate::new("accounts; DROP TABLE x", "id");
}

#[tokio::test]
async fn postgres_store_raises_atomically_and_its_reject_cache_skips_the_round_trip() {
    let (db, client) = fresh_db().await;
    let plain = PostgresStore::new(Arc::new(db.connect().await));
    let cached = PostgresStore::new(Arc::new(db.connect().await)).with_reject_cache(100);
    assert_eq!(plain.raise("r", tok(10)).await.unwrap(), Raise::Admitted);
    assert_eq!(plain.raise("r", tok(10)).await.unwrap(), Raise::Admitted);
    assert_eq!(
        plain.raise("r", tok(9)).await.unwrap(),
        Raise::Stale { highest: tok(10) }
    );
    assert_eq!(
        cached.raise("r", tok(3)).await.unwrap(),
        Raise::Stale { highest: tok(10) }
    );
    assert_eq!(mark(&client, "r").await, Some(tok(10)));
    // Lower the row by hand: only a store that did not ask Postgres still says 10.
    client
        .batch_execute("UPDATE palisade_fence.fence_high_water SET token = 0")
        .await
        .unwrap();
    assert_eq!(
        cached.raise("r", tok(3)).await.unwrap(),
        Raise::Stale { highest: tok(10) }
    );
    assert_eq!(plain.raise("r", tok(3)).await.unwrap(), Raise::Admitted);
    // An admit always goes to Postgres.
    assert_eq!(cached.raise("r", tok(11)).await.unwrap(), Raise::Admitted);
    assert_eq!(mark(&client, "r").await, Some(tok(11)));
}

#[tokio::test]
async fn postgres_store_reports_a_dead_connection_as_a_retryable_error() {
    let (db, client) = fresh_db().await;
    let conn = db.connect().await;
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let store = PostgresStore::new(Arc::new(conn));
    client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = store.raise("r", tok(1)).await.unwrap_err();
    assert!(err.is_retryable());
    assert!(std::error::Error::source(&err).is_some());
}

#[tokio::test]
async fn tokens_round_trip_through_bigint_and_negative_values_are_refused() {
    let (_db, client) = fresh_db().await;
    for t in [FencingToken::MIN, tok(1), FencingToken::MAX] {
        let back: FencingToken = client
            .query_one("SELECT $1::bigint", &[&t])
            .await
            .unwrap()
            .get(0);
        assert_eq!(back, t);
    }
    let row = client.query_one("SELECT (-1)::bigint", &[]).await.unwrap();
    let err = row.try_get::<_, FencingToken>(0).unwrap_err();
    let cause = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<palisade_fence::TokenRangeError>());
    assert_eq!(
        cause,
        Some(&palisade_fence::TokenRangeError::NegativeToken(-1))
    );
    let wrong_type = client.query_one("SELECT 1::int4", &[]).await.unwrap();
    assert!(
        wrong_type.try_get::<_, FencingToken>(0).is_err(),
        "only BIGINT is accepted"
    );
}

/// An equal token is admitted by the read alone: the row is not rewritten (its `xmin`,
/// the transaction that last wrote it, stays); a newer token rewrites it; a lower one is
/// refused naming the mark, also after a raise by another store.
#[tokio::test]
async fn postgres_store_admits_an_equal_token_without_writing() {
    let (db, client) = fresh_db().await;
    let store = PostgresStore::new(Arc::new(db.connect().await));
    let other = PostgresStore::new(Arc::new(db.connect().await));
    async fn xmin(client: &tokio_postgres::Client) -> String {
        client
            .query_one(
                "SELECT xmin::text FROM palisade_fence.fence_high_water WHERE resource = 'r'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }
    assert_eq!(store.raise("r", tok(10)).await.unwrap(), Raise::Admitted);
    let first = xmin(&client).await;
    for _ in 0..3 {
        assert_eq!(store.raise("r", tok(10)).await.unwrap(), Raise::Admitted);
    }
    assert_eq!(xmin(&client).await, first, "an equal token rewrote the row");
    assert_eq!(other.raise("r", tok(12)).await.unwrap(), Raise::Admitted);
    assert_ne!(xmin(&client).await, first, "a newer token must write");
    assert_eq!(
        store.raise("r", tok(10)).await.unwrap(),
        Raise::Stale { highest: tok(12) }
    );
    assert_eq!(store.raise("r", tok(12)).await.unwrap(), Raise::Admitted);
    assert_eq!(mark(&client, "r").await, Some(tok(12)));
}
