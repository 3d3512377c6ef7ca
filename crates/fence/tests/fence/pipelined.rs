//! `fenced_execute` (one round trip) and the folded update's cached-types path, on a real
//! database.

use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{fenced_execute, FenceErrorKind, FencedUpdate, FencingToken, PreparedFence};
use tokio_postgres::error::SqlState;

use crate::common::{pause, shuffle, stagger, tok};
use crate::postgres_helper::{check_log, fresh_db, mark, LOG_TABLE};

const ACCOUNTS: &str =
    "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint); \
     INSERT INTO accounts SELECT g, 0, NULL FROM generate_series(1, 3) g";

async fn balance(client: &tokio_postgres::Client, id: i64) -> i64 {
    client
        .query_one("SELECT balance FROM accounts WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn fenced_execute_commits_all_statements_in_one_transaction_and_raises_the_mark() {
    let (_db, client) = fresh_db().await;
    client.batch_execute(ACCOUNTS).await.unwrap();
    client.batch_execute(LOG_TABLE).await.unwrap();
    let add = client
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    let log = client
        .prepare("INSERT INTO write_log (token) VALUES ($1)")
        .await
        .unwrap();
    let t = tok(10);
    let counts = fenced_execute(
        &client,
        "account/1",
        t,
        &[(&add, &[&1_i64, &5_i64]), (&log, &[&t])],
    )
    .await
    .unwrap();
    assert_eq!(counts, vec![1, 1]);
    assert_eq!(balance(&client, 1).await, 5);
    assert_eq!(mark(&client, "account/1").await, Some(t));
    // The raise, the update and the insert were one transaction: the log row's txid is
    // the one that last wrote the high-water row.
    let same: bool = client
        .query_one(
            "SELECT (SELECT txid FROM write_log)::text::bigint = \
             (SELECT xmin::text::bigint FROM palisade_fence.fence_high_water WHERE resource = 'account/1')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        same,
        "the statements and the raise committed in different transactions"
    );
    // Equal is admitted; zero statements is a bare raise.
    assert_eq!(
        fenced_execute(&client, "account/1", t, &[]).await.unwrap(),
        Vec::<u64>::new()
    );
}

#[tokio::test]
async fn fenced_execute_with_a_stale_token_writes_nothing_and_names_the_mark() {
    let (db, client) = fresh_db().await;
    client.batch_execute(ACCOUNTS).await.unwrap();
    let add = client
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    fenced_execute(&client, "account/1", tok(10), &[(&add, &[&1_i64, &1_i64])])
        .await
        .unwrap();
    let err = fenced_execute(
        &client,
        "account/1",
        tok(9),
        &[(&add, &[&1_i64, &1_000_i64]), (&add, &[&2_i64, &7_i64])],
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), FenceErrorKind::Stale, "{err:?}");
    assert_eq!((err.token(), err.highest()), (Some(tok(9)), Some(tok(10))));
    assert!(!err.is_retryable());
    assert_eq!(
        (balance(&client, 1).await, balance(&client, 2).await),
        (1, 0),
        "a refused write changed rows"
    );
    assert_eq!(mark(&client, "account/1").await, Some(tok(10)));
    // The connection is not left inside a transaction: a plain write on it is visible to
    // another connection at once.
    client
        .batch_execute("UPDATE accounts SET balance = 42 WHERE id = 3")
        .await
        .unwrap();
    assert_eq!(balance(&db.connect().await, 3).await, 42);
}

#[tokio::test]
async fn fenced_execute_rolls_back_the_raise_and_earlier_statements_when_one_fails() {
    let (_db, client) = fresh_db().await;
    client.batch_execute(ACCOUNTS).await.unwrap();
    client
        .batch_execute("CREATE TABLE t (x bigint CHECK (x > 0))")
        .await
        .unwrap();
    let add = client
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    let ins = client.prepare("INSERT INTO t VALUES ($1)").await.unwrap();
    fenced_execute(&client, "r", tok(10), &[]).await.unwrap();
    let err = fenced_execute(
        &client,
        "r",
        tok(20),
        &[
            (&add, &[&1_i64, &5_i64]),
            (&ins, &[&-1_i64]),
            (&add, &[&2_i64, &5_i64]),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), FenceErrorKind::Database);
    assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION));
    assert_eq!(
        (balance(&client, 1).await, balance(&client, 2).await),
        (0, 0)
    );
    assert_eq!(
        mark(&client, "r").await,
        Some(tok(10)),
        "the raise rolled back with the statements"
    );
}

#[tokio::test]
async fn fenced_execute_refuses_parameters_that_do_not_fit_before_sending_anything() {
    let (_db, client) = fresh_db().await;
    client.batch_execute(ACCOUNTS).await.unwrap();
    let add = client
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    // The first statement is fine; the second has a text where a bigint goes, the third
    // too few parameters. Sending the first alone would commit it unfenced by the rest.
    let wrong_type = fenced_execute(
        &client,
        "r",
        tok(5),
        &[(&add, &[&1_i64, &1_i64]), (&add, &[&2_i64, &"ten"])],
    )
    .await
    .unwrap_err();
    assert_eq!(wrong_type.kind(), FenceErrorKind::BadParameters);
    assert!(std::error::Error::source(&wrong_type).is_some());
    let too_few = fenced_execute(
        &client,
        "r",
        tok(5),
        &[(&add, &[&1_i64, &1_i64]), (&add, &[&2_i64])],
    )
    .await
    .unwrap_err();
    assert_eq!(too_few.kind(), FenceErrorKind::BadParameters);
    assert_eq!(
        too_few.to_string(),
        "fenced write: 1 parameters given where the statement takes 2"
    );
    assert_eq!(balance(&client, 1).await, 0);
    assert_eq!(
        mark(&client, "r").await,
        None,
        "nothing was sent, not even the raise"
    );
}

/// The ordering test of `fenced_transaction`, through the pipelined form: 32 writers of
/// one resource at once and staggered; the log's commit order never decreases and holds
/// exactly the admitted writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_pipelined_writers_commit_in_token_order() {
    let (db, client) = fresh_db().await;
    client.batch_execute(LOG_TABLE).await.unwrap();
    for round in 0..4u64 {
        client
            .batch_execute("TRUNCATE write_log; DELETE FROM palisade_fence.fence_high_water")
            .await
            .unwrap();
        let mut tokens: Vec<FencingToken> = (0..32).map(|i| tok(2_000 + 5 * i + round)).collect();
        shuffle(&mut tokens, 0xbead + round);
        let barrier = Arc::new(tokio::sync::Barrier::new(tokens.len()));
        let mut tasks = Vec::new();
        for &token in &tokens {
            let c = db.connect().await;
            let barrier = Arc::clone(&barrier);
            let delay = if round >= 2 {
                stagger(&tokens, token, 3, round)
            } else {
                Duration::ZERO
            };
            tasks.push(tokio::spawn(async move {
                let sleep = c.prepare("SELECT pg_sleep($1)").await.unwrap();
                let log = c
                    .prepare("INSERT INTO write_log (token) VALUES ($1)")
                    .await
                    .unwrap();
                barrier.wait().await;
                tokio::time::sleep(delay).await;
                let p = pause(token);
                let r = fenced_execute(
                    &c,
                    "account/1",
                    token,
                    &[(&sleep, &[&p]), (&log, &[&token])],
                )
                .await;
                (token, r)
            }));
        }
        let mut admitted = Vec::new();
        for t in tasks {
            let (token, r) = t.await.unwrap();
            match r {
                Ok(counts) => {
                    assert_eq!(counts, vec![1, 1]);
                    admitted.push(token);
                }
                Err(e) => {
                    assert!(e.is_stale(), "{e:?}");
                    assert!(e.highest().unwrap() > token);
                }
            }
        }
        eprintln!("round {round}: admitted {}", admitted.len());
        check_log(&client, &admitted).await;
        let max = *tokens.iter().max().unwrap();
        assert!(
            admitted.contains(&max),
            "the largest token is always admitted"
        );
        assert_eq!(mark(&client, "account/1").await, Some(max));
    }
}

/// After its first call learned the parameter types, a folded update sends one message;
/// that path still refuses a stale token without writing, and tells a missing row apart.
#[tokio::test]
async fn folded_update_on_its_cached_path_still_refuses_stale_tokens() {
    let (_db, client) = fresh_db().await;
    client.batch_execute(ACCOUNTS).await.unwrap();
    let accounts = FencedUpdate::new("accounts", "id");
    let set = "balance = balance + $3";
    assert_eq!(
        accounts
            .execute(&client, &1_i64, set, &[&1_i64], tok(5))
            .await
            .unwrap(),
        1
    );
    // A clone shares what was learned; both paths agree.
    let clone = accounts.clone();
    assert_eq!(clone, accounts);
    for _ in 0..3 {
        assert_eq!(
            clone
                .execute(&client, &1_i64, set, &[&1_i64], tok(6))
                .await
                .unwrap(),
            1
        );
    }
    let stale = clone
        .execute(&client, &1_i64, set, &[&1_000_i64], tok(4))
        .await
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(6)))
    );
    let missing = clone
        .execute(&client, &9_i64, set, &[&1_i64], tok(7))
        .await
        .unwrap_err();
    assert!(missing.is_row_missing());
    assert_eq!(balance(&client, 1).await, 4);
    // A wrong parameter type on the cached path is a database-side error, not a write.
    let wrong = clone
        .execute(&client, &1_i64, set, &[&"x"], tok(8))
        .await
        .unwrap_err();
    assert!(!wrong.is_stale());
    assert_eq!(balance(&client, 1).await, 4);
}

/// The prepared forms: same refusals, nothing written on a stale token, and a statement
/// prepared on another connection writes nothing.
#[tokio::test]
async fn prepared_forms_refuse_stale_tokens_and_belong_to_their_connection() {
    let (db, client) = fresh_db().await;
    client.batch_execute(ACCOUNTS).await.unwrap();
    let add = client
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    let fence = PreparedFence::prepare(&client).await.unwrap();
    assert_eq!(
        fence
            .execute(&client, "account/1", tok(10), &[(&add, &[&1_i64, &2_i64])])
            .await
            .unwrap(),
        vec![1]
    );
    let stale = fence
        .execute(&client, "account/1", tok(9), &[(&add, &[&1_i64, &100_i64])])
        .await
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(10)))
    );
    assert_eq!(balance(&client, 1).await, 2);

    let folded = FencedUpdate::new("accounts", "id")
        .prepare(&client, "balance = balance + $3")
        .await
        .unwrap();
    assert_eq!(
        folded
            .execute(&client, &2_i64, &[&7_i64], tok(4))
            .await
            .unwrap(),
        1
    );
    let stale = folded
        .execute(&client, &2_i64, &[&1_000_i64], tok(3))
        .await
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(4)))
    );
    assert!(folded
        .execute(&client, &9_i64, &[&1_i64], tok(5))
        .await
        .unwrap_err()
        .is_row_missing());
    assert_eq!(balance(&client, 2).await, 7);

    // On another connection the prepared raise does not exist: nothing is written.
    let other = db.connect().await;
    let add_other = other
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    let err = fence
        .execute(
            &other,
            "account/3",
            tok(50),
            &[(&add_other, &[&3_i64, &1_i64])],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&SqlState::INVALID_SQL_STATEMENT_NAME),
        "{err:?}"
    );
    assert_eq!(balance(&client, 3).await, 0);
    assert_eq!(mark(&client, "account/3").await, None);
}
