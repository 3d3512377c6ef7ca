//! The raise's locks on the mark row, on a real database: an equal token takes a share
//! lock and writes nothing, a newer token's raise waits for every writer in flight, and
//! the functions read their own table whatever the caller's search_path.

use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{
    begin_fenced, fenced_execute, fenced_transaction, FenceError, FenceErrorKind, FencingToken,
    PreparedFence,
};
use tokio_postgres::error::SqlState;

use crate::common::{pause, shuffle, stagger, tok};
use crate::postgres_helper::{check_log, fresh_db, mark, until_waiting, LOG_TABLE};

/// The transaction that last wrote the mark row (its `xmin`).
pub(crate) async fn mark_writer(client: &tokio_postgres::Client, resource: &str) -> String {
    client
        .query_one(
            "SELECT xmin::text FROM palisade_fence.fence_high_water WHERE resource = $1",
            &[&resource],
        )
        .await
        .unwrap()
        .get(0)
}

async fn log(tx: &tokio_postgres::Transaction<'_>, token: FencingToken) {
    tx.execute("INSERT INTO write_log (token) VALUES ($1)", &[&token])
        .await
        .unwrap();
}

/// A token equal to the mark is admitted by every form without a new version of the row
/// (its `xmin` stays that of the raise); a newer token writes it.
#[tokio::test]
async fn an_equal_token_is_admitted_without_rewriting_the_mark_row() {
    let (_db, mut client) = fresh_db().await;
    client
        .batch_execute("CREATE TABLE t (x bigint)")
        .await
        .unwrap();
    let insert = client.prepare("INSERT INTO t VALUES ($1)").await.unwrap();
    let fence = PreparedFence::prepare(&client).await.unwrap();
    fenced_transaction(&mut client, "r", tok(10), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    let raised_by = mark_writer(&client, "r").await;
    for i in 0..3_i64 {
        fenced_transaction(&mut client, "r", tok(10), move |tx| {
            Box::pin(async move {
                tx.execute("INSERT INTO t VALUES ($1)", &[&i]).await?;
                Ok::<_, FenceError>(())
            })
        })
        .await
        .unwrap();
        assert_eq!(
            fenced_execute(&client, "r", tok(10), &[(&insert, &[&i])])
                .await
                .unwrap(),
            vec![1]
        );
        assert_eq!(
            fence
                .execute(&client, "r", tok(10), &[(&insert, &[&i])])
                .await
                .unwrap(),
            vec![1]
        );
    }
    assert_eq!(
        mark_writer(&client, "r").await,
        raised_by,
        "an equal token rewrote the mark row"
    );
    let n: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 9, "every equal-token write committed");
    // Below is refused by every form, naming the mark; nothing is written.
    let stale = fenced_execute(&client, "r", tok(9), &[(&insert, &[&99_i64])])
        .await
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(10)))
    );
    let stale = begin_fenced(&mut client, "r", tok(9))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(10)))
    );
    fence
        .execute(&client, "r", tok(11), &[(&insert, &[&11_i64])])
        .await
        .unwrap();
    assert_ne!(
        mark_writer(&client, "r").await,
        raised_by,
        "a newer token must write the mark"
    );
    assert_eq!(mark(&client, "r").await, Some(tok(11)));
    let n: i64 = client
        .query_one("SELECT count(*) FROM t WHERE x = 99", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

/// Two writers with the mark's token run side by side; a newer token's raise waits until
/// *both* have ended (not just the first); a writer with the old token that arrives while
/// the raise is in flight waits for it and is then refused. The log's commit order never
/// decreases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_waits_for_every_writer_in_flight_with_the_old_token() {
    let (db, admin) = fresh_db().await;
    admin.batch_execute(LOG_TABLE).await.unwrap();
    let (mut a, mut b, mut c, mut d) = (
        db.connect().await,
        db.connect().await,
        db.connect().await,
        db.connect().await,
    );
    fenced_transaction(&mut a, "r", tok(10), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();

    // Both admitted at once: neither has committed when the other is admitted.
    let ta = begin_fenced(&mut a, "r", tok(10)).await.unwrap();
    let tb = begin_fenced(&mut b, "r", tok(10)).await.unwrap();
    log(&ta, tok(10)).await;
    log(&tb, tok(10)).await;

    let raiser = tokio::spawn(async move {
        let tc = begin_fenced(&mut c, "r", tok(11)).await.unwrap();
        log(&tc, tok(11)).await;
        tc.commit().await.unwrap();
    });
    until_waiting(&admin, 1).await;
    ta.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !raiser.is_finished(),
        "the raise went ahead while an equal-token writer was in flight"
    );
    assert_eq!(mark(&admin, "r").await, Some(tok(10)));

    // The raise now waits for b only; an old-token writer queues behind the raise.
    let late = tokio::spawn(async move { begin_fenced(&mut d, "r", tok(10)).await.map(|_| ()) });
    until_waiting(&admin, 2).await;
    tb.commit().await.unwrap();
    raiser.await.unwrap();
    let late = late.await.unwrap().map_err(|e| (e.kind(), e.highest()));
    assert_eq!(late, Err((FenceErrorKind::Stale, Some(tok(11)))));
    check_log(&admin, &[tok(10), tok(10), tok(11)]).await;
    assert_eq!(mark(&admin, "r").await, Some(tok(11)));
}

/// 32 concurrent writers of one resource with 8 distinct tokens, 4 writers each, in a
/// shuffled order, once all at once and once staggered: writers with the mark's token
/// share the row, raises wait for them. Commit order never decreases, exactly the
/// admitted writers wrote, and every refusal names a higher mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_sharing_tokens_commit_in_token_order() {
    let (db, client) = fresh_db().await;
    client.batch_execute(LOG_TABLE).await.unwrap();
    for round in 0..4u64 {
        client
            .batch_execute("TRUNCATE write_log; DELETE FROM palisade_fence.fence_high_water")
            .await
            .unwrap();
        let mut tokens: Vec<FencingToken> =
            (0..32).map(|i| tok(3_000 + 11 * (i / 4) + round)).collect();
        shuffle(&mut tokens, 0x5a5e + round);
        let barrier = Arc::new(tokio::sync::Barrier::new(tokens.len()));
        let mut tasks = Vec::new();
        for (i, &token) in tokens.iter().enumerate() {
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
                // Half the writers use the closure form, half the pipelined one.
                let r = if i % 2 == 0 {
                    fenced_transaction(&mut c, "account/1", token, |tx| {
                        Box::pin(async move {
                            tx.execute("SELECT pg_sleep($1)", &[&pause(token)]).await?;
                            tx.execute("INSERT INTO write_log (token) VALUES ($1)", &[&token])
                                .await?;
                            Ok::<_, FenceError>(())
                        })
                    })
                    .await
                } else {
                    let sleep = c.prepare("SELECT pg_sleep($1)").await.unwrap();
                    let log = c
                        .prepare("INSERT INTO write_log (token) VALUES ($1)")
                        .await
                        .unwrap();
                    let p = pause(token);
                    fenced_execute(
                        &c,
                        "account/1",
                        token,
                        &[(&sleep, &[&p]), (&log, &[&token])],
                    )
                    .await
                    .map(|_| ())
                };
                (token, r)
            }));
        }
        let mut admitted = Vec::new();
        for t in tasks {
            let (token, r) = t.await.unwrap();
            match r {
                Ok(()) => admitted.push(token),
                Err(e) => {
                    assert!(e.is_stale(), "{e:?}");
                    assert!(
                        e.highest().unwrap() > token,
                        "refused {token} naming {:?}",
                        e.highest()
                    );
                }
            }
        }
        let max = *tokens.iter().max().unwrap();
        let shared = admitted
            .iter()
            .filter(|t| admitted.iter().filter(|u| u == t).count() > 1)
            .count();
        eprintln!(
            "round {round}: admitted {}, {shared} of them with a token admitted more than once",
            admitted.len()
        );
        check_log(&client, &admitted).await;
        assert_eq!(
            admitted.iter().filter(|t| **t == max).count(),
            4,
            "every writer with the largest token is admitted"
        );
        assert_eq!(mark(&client, "account/1").await, Some(max));
    }
}

/// At `REPEATABLE READ` an equal token whose share lock waited for a raise cannot read
/// the new mark through its snapshot: it fails as a retryable serialization failure
/// instead of being admitted.
#[tokio::test]
async fn an_equal_token_behind_a_raise_at_repeatable_read_is_a_serialization_failure() {
    let (db, mut a) = fresh_db().await;
    let mut b = db.connect().await;
    let admin = db.connect().await;
    fenced_transaction(&mut a, "r", tok(5), |_| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    b.batch_execute("SET default_transaction_isolation = 'repeatable read'")
        .await
        .unwrap();
    let raise = begin_fenced(&mut a, "r", tok(6)).await.unwrap();
    let waiter = tokio::spawn(async move { begin_fenced(&mut b, "r", tok(5)).await.map(|_| ()) });
    until_waiting(&admin, 1).await;
    raise.commit().await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), FenceErrorKind::SerializationFailure, "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE));
}

#[tokio::test]
async fn raise_or_abort_with_a_null_argument_aborts_what_follows() {
    let (_db, client) = fresh_db().await;
    client
        .batch_execute("CREATE TABLE after_null (n int)")
        .await
        .unwrap();
    let err = client
        .batch_execute("BEGIN; SELECT palisade_fence.fence_raise_or_abort('r', NULL); INSERT INTO after_null VALUES (1); COMMIT")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::NULL_VALUE_NOT_ALLOWED), "{err}");
    client.batch_execute("ROLLBACK").await.unwrap();
    let n: i64 = client
        .query_one("SELECT count(*) FROM after_null", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing after the NULL raise committed");
}

#[tokio::test]
async fn a_temporary_table_named_like_the_mark_table_does_not_stand_in_for_it() {
    let (_db, mut client) = fresh_db().await;
    fenced_transaction(&mut client, "t/1", tok(25), |_tx| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap();
    client
        .batch_execute(
            "CREATE TEMP TABLE fence_high_water (resource text PRIMARY KEY, token bigint NOT NULL, \
             updated_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    let err = fenced_transaction(&mut client, "t/1", tok(1), |_tx| {
        Box::pin(async { Ok::<_, FenceError>(()) })
    })
    .await
    .unwrap_err();
    assert!(err.is_stale(), "{err:?}");
    assert_eq!(err.highest(), Some(tok(25)));
}

/// The functions name their table, functions and operators by schema: a caller whose
/// search_path puts first a schema with its own `fence_high_water` (holding a higher
/// mark) and an `=` on text that never matches, before `pg_catalog`, still raises the
/// marks of the schema the functions were created in.
#[tokio::test]
async fn a_callers_search_path_does_not_point_the_raise_at_another_table_or_operator() {
    let (_db, client) = fresh_db().await;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA decoy; \
             CREATE TABLE decoy.fence_high_water (resource text PRIMARY KEY, token bigint NOT NULL, \
                 updated_at timestamptz NOT NULL DEFAULT now()); \
             INSERT INTO decoy.fence_high_water (resource, token) VALUES ('d/1', {high}), ('d/2', {high}); \
             CREATE FUNCTION decoy.never(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT false'; \
             CREATE OPERATOR decoy.= (LEFTARG = text, RIGHTARG = text, FUNCTION = decoy.never); \
             SET search_path = decoy, pg_catalog, public, palisade_fence",
            high = tok(100).get()
        ))
        .await
        .unwrap();
    let raise = |sql: &'static str, t: FencingToken| {
        let client = &client;
        async move {
            let row = client
                .query_one(sql, &[&t])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            row.get::<_, i64>(0)
        }
    };
    let t = tok(7).get() as i64;
    // A new token, then an equal one, then an older one, through each function.
    assert_eq!(
        raise("SELECT palisade_fence.fence_raise('d/1', $1)", tok(7)).await,
        t
    );
    assert_eq!(
        raise("SELECT palisade_fence.fence_raise('d/1', $1)", tok(7)).await,
        t
    );
    assert_eq!(
        raise("SELECT palisade_fence.fence_raise('d/1', $1)", tok(6)).await,
        t
    );
    assert_eq!(
        raise(
            "SELECT palisade_fence.fence_raise_or_abort('d/2', $1)",
            tok(7)
        )
        .await,
        t
    );
    assert_eq!(
        raise(
            "SELECT palisade_fence.fence_raise_or_abort('d/2', $1)",
            tok(7)
        )
        .await,
        t
    );
    let marks = client
        .query(
            "SELECT resource, token FROM palisade_fence.fence_high_water ORDER BY resource",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect::<Vec<_>>();
    assert_eq!(marks, vec![("d/1".to_owned(), t), ("d/2".to_owned(), t)]);
    let decoy: i64 = client
        .query_one(
            "SELECT count(*) FROM decoy.fence_high_water WHERE token = $1",
            &[&tok(100)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(decoy, 2, "the decoy table was left alone");
}
