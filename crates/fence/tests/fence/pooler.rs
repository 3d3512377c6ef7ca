//! Every Postgres path behind a real PgBouncer in transaction pool mode, where each
//! transaction may run on another server connection.

use std::sync::Arc;

use axum::routing::put;
use axum::Router;
use http::{Method, StatusCode};
use palisade_fence::{
    begin_fenced, fenced_execute, fenced_transaction, migrate, FenceError, FenceErrorKind,
    FenceLayer, FencedUpdate, HighWaterStore, PostgresStore, PreparedFence, Raise,
};
use palisade_testkit::{PgBouncer, TestDb};
use tokio_postgres::{Client, NoTls};

use crate::common::{client, pool, send, serve, tok};
use crate::postgres_helper::mark;

const ACCOUNTS: &str =
    "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint); \
     INSERT INTO accounts SELECT g, 0, NULL FROM generate_series(1, 3) g";

/// A fresh database, migrated directly, and a PgBouncer in front of the server.
struct Pooled {
    db: TestDb,
    bouncer: PgBouncer,
    direct: Client,
}

impl Pooled {
    async fn new() -> Pooled {
        let db = TestDb::create().await;
        let mut direct = db.connect().await;
        migrate(&mut direct).await.unwrap();
        direct.batch_execute(ACCOUNTS).await.unwrap();
        let bouncer = PgBouncer::start().await.unwrap();
        Pooled {
            db,
            bouncer,
            direct,
        }
    }

    /// A connection through PgBouncer.
    async fn connect(&self) -> Client {
        let conn = self.bouncer.connection_string(self.db.name());
        let (client, connection) = tokio_postgres::connect(&conn, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    async fn balance(&self, id: i64) -> i64 {
        self.direct
            .query_one("SELECT balance FROM accounts WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0)
    }
}

/// Takes the server connection PgBouncer would hand out next (it reuses the most recent
/// one first) and keeps it inside a transaction until dropped, so the next transaction of
/// any other client runs on another backend.
struct Hog {
    client: Client,
}

impl Hog {
    async fn take(pooled: &Pooled) -> Hog {
        let client = pooled.connect().await;
        client.batch_execute("BEGIN; SELECT 1").await.unwrap();
        Hog { client }
    }

    async fn release(self) {
        self.client.batch_execute("COMMIT").await.unwrap();
    }
}

/// The store behind the layer: forty sequential fenced writes, each while another client
/// holds the backend the previous write ran on, all admitted; a stale one is refused.
#[tokio::test]
async fn the_postgres_store_behind_pgbouncer_admits_every_write_on_any_backend() {
    let pooled = Pooled::new().await;
    let store = PostgresStore::new(Arc::new(pooled.connect().await));
    let app = Router::new()
        .route("/orders/{id}", put(|| async { "ok" }))
        .layer(FenceLayer::new(store));
    let addr = serve(app).await;
    let c = client();
    for i in 1..=40_u64 {
        let hog = Hog::take(&pooled).await;
        let r = send(&c, Method::PUT, addr, "/orders/1", &[&tok(i).to_string()]).await;
        assert_eq!(r.status, StatusCode::OK, "write {i}: {}", r.text());
        hog.release().await;
    }
    let r = send(&c, Method::PUT, addr, "/orders/1", &[&tok(39).to_string()]).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(mark(&pooled.direct, "/orders/1").await, Some(tok(40)));
}

/// A store on a pool of connections through PgBouncer: many raises at once, batched,
/// each with its own verdict.
#[tokio::test]
async fn a_pooled_store_behind_pgbouncer_decides_concurrent_raises() {
    let pooled = Pooled::new().await;
    let config: tokio_postgres::Config = pooled
        .bouncer
        .connection_string(pooled.db.name())
        .parse()
        .unwrap();
    let pool = pool(config, 4);
    let store = PostgresStore::from_pool(pool);
    crate::store_batches::check_concurrent_raises(&store, &pooled.direct).await;
}

/// `fenced_transaction` and `begin_fenced` keep everything inside one transaction, so
/// they run behind the pooler as they do directly.
#[tokio::test]
async fn fenced_transaction_behind_pgbouncer_commits_and_refuses_stale_writers() {
    let pooled = Pooled::new().await;
    let mut a = pooled.connect().await;
    for (i, t) in [5_u64, 6, 6, 7].into_iter().enumerate() {
        let hog = Hog::take(&pooled).await;
        let n = fenced_transaction(&mut a, "account/1", tok(t), |tx| {
            Box::pin(async move {
                let n = tx
                    .execute(
                        "UPDATE accounts SET balance = balance + 1 WHERE id = 1",
                        &[],
                    )
                    .await?;
                Ok::<_, FenceError>(n)
            })
        })
        .await
        .unwrap_or_else(|e| panic!("write {i} with {t}: {e:?}"));
        assert_eq!(n, 1);
        hog.release().await;
    }
    let stale = fenced_transaction(&mut a, "account/1", tok(6), |tx| {
        Box::pin(async move {
            tx.execute(
                "UPDATE accounts SET balance = balance + 100 WHERE id = 1",
                &[],
            )
            .await?;
            Ok::<_, FenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(7)))
    );
    let tx = begin_fenced(&mut a, "account/1", tok(8)).await.unwrap();
    tx.execute(
        "UPDATE accounts SET balance = balance + 10 WHERE id = 1",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(pooled.balance(1).await, 14);
    assert_eq!(mark(&pooled.direct, "account/1").await, Some(tok(8)));
}

/// `FencedUpdate` (not prepared) learns its parameter types and runs unnamed statements:
/// it runs behind the pooler, whichever backend each call lands on.
#[tokio::test]
async fn fenced_update_behind_pgbouncer_runs_on_any_backend() {
    let pooled = Pooled::new().await;
    let a = pooled.connect().await;
    let accounts = FencedUpdate::new("accounts", "id");
    for t in [3_u64, 4, 4, 5] {
        let hog = Hog::take(&pooled).await;
        let n = accounts
            .execute(&a, &2_i64, "balance = balance + $3", &[&1_i64], tok(t))
            .await
            .unwrap_or_else(|e| panic!("token {t}: {e:?}"));
        assert_eq!(n, 1);
        hog.release().await;
    }
    let stale = accounts
        .execute(&a, &2_i64, "balance = balance + $3", &[&100_i64], tok(4))
        .await
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(5)))
    );
    assert_eq!(pooled.balance(2).await, 4);
    // No named statement is left behind on the backends (asked with an unnamed
    // statement, which is not listed itself).
    let left: i64 = pooled
        .connect()
        .await
        .query_typed_one("SELECT count(*) FROM pg_prepared_statements", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// Many clients at once, each learning its update's types afresh on every call: every
/// call lands on whichever backend is free, and every one succeeds.
#[tokio::test]
async fn fresh_fenced_updates_from_many_clients_behind_pgbouncer_all_succeed() {
    let pooled = Pooled::new().await;
    let mut writers = Vec::new();
    for w in 0..6_i64 {
        let client = pooled.connect().await;
        pooled
            .direct
            .execute("INSERT INTO accounts VALUES ($1, 0, NULL)", &[&(100 + w)])
            .await
            .unwrap();
        writers.push(tokio::spawn(async move {
            for t in 1..=15_u64 {
                FencedUpdate::new("accounts", "id")
                    .execute(
                        &client,
                        &(100 + w),
                        "balance = balance + $3",
                        &[&1_i64],
                        tok(t),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}, token {t}: {e:?}"));
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let total: i64 = pooled
        .direct
        .query_one(
            "SELECT sum(balance)::bigint FROM accounts WHERE id >= 100",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(total, 6 * 15);
}

/// The prepared forms need the session their statements were prepared in. Behind a
/// transaction-mode pooler the next transaction may run elsewhere: the error says so, as
/// its own kind, and nothing is written.
#[tokio::test]
async fn prepared_forms_behind_pgbouncer_fail_with_a_session_error_and_write_nothing() {
    let pooled = Pooled::new().await;
    let a = pooled.connect().await;
    let add = a
        .prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
        .await
        .unwrap();
    let fence = PreparedFence::prepare(&a).await.unwrap();
    let folded = FencedUpdate::new("accounts", "id")
        .prepare(&a, "balance = balance + $3")
        .await
        .unwrap();

    let hog = Hog::take(&pooled).await;
    let e = fenced_execute(&a, "account/3", tok(5), &[(&add, &[&3_i64, &1_i64])])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::NeedsSession, "{e}");
    assert!(e.to_string().contains("session"), "{e}");
    let e = fence
        .execute(&a, "account/3", tok(5), &[(&add, &[&3_i64, &1_i64])])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::NeedsSession, "{e}");
    let e = folded
        .execute(&a, &3_i64, &[&1_i64], tok(5))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::NeedsSession, "{e}");
    assert!(!e.is_retryable());
    hog.release().await;

    assert_eq!(pooled.balance(3).await, 0, "nothing was written");
    assert_eq!(mark(&pooled.direct, "account/3").await, None);
}

/// A store told to use prepared statements needs a session too. Behind a transaction-mode
/// pooler, once its next batch runs on another backend, the raise fails as a
/// misconfiguration (not retryable, naming the setting) and raises nothing, where the
/// default store (first test above) admits every write.
#[tokio::test]
async fn a_store_with_prepared_statements_behind_pgbouncer_fails_with_a_session_error() {
    let pooled = Pooled::new().await;
    let store = PostgresStore::new(Arc::new(pooled.connect().await)).with_prepared_statements();
    assert_eq!(
        store.raise("orders/7", tok(1)).await.unwrap(),
        Raise::Admitted
    );

    let hog = Hog::take(&pooled).await;
    let e = store.raise("orders/7", tok(2)).await.unwrap_err();
    assert!(!e.is_retryable(), "{e:?}");
    let cause = std::error::Error::source(&e).map(ToString::to_string);
    let cause = cause.unwrap_or_default();
    assert!(
        cause.contains("with_prepared_statements needs a session"),
        "{cause}"
    );
    hog.release().await;
    assert_eq!(mark(&pooled.direct, "orders/7").await, Some(tok(1)));
}

/// Behind a pooler with one server connection every client's statements live on it, so a
/// statement another client prepared under the store's name runs in place of the store's.
/// Its answer is not signed as the store's are: the batch fails as a misconfiguration,
/// and no verdict is taken from it (unsigned, this answer admitted token 50 under a mark
/// of 100).
#[tokio::test]
async fn a_prepared_store_takes_no_verdict_from_another_clients_statement_under_its_name() {
    let db = TestDb::create().await;
    let mut direct = db.connect().await;
    migrate(&mut direct).await.unwrap();
    let bouncer = PgBouncer::start_for("127.0.0.1", 5432, 1).await.unwrap();
    let connect = || async {
        let conn = bouncer.connection_string(db.name());
        let (client, connection) = tokio_postgres::connect(&conn, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    };
    let store = PostgresStore::new(Arc::new(connect().await)).with_prepared_statements();
    assert_eq!(
        store.raise("orders/9", tok(100)).await.unwrap(),
        Raise::Admitted
    );

    // Simple queries only: the other client prepares nothing of its own by the way.
    let other = connect().await;
    let found = other
        .simple_query(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE '%palisade_fence.fence_decide(%'",
        )
        .await
        .unwrap();
    let name = found
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("the store's statement, on the one server connection");
    for foreign in ["SELECT $2", "SELECT $2, 'mine'::text"] {
        other
            .batch_execute(&format!(
                "DEALLOCATE {name}; PREPARE {name}(text, bigint) AS {foreign}"
            ))
            .await
            .unwrap();
        let e = store.raise("orders/9", tok(50)).await.unwrap_err();
        assert!(!e.is_retryable(), "{foreign}: {e:?}");
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        let cause = cause.unwrap_or_default();
        assert!(cause.contains("is not the store's"), "{foreign}: {cause}");
    }
    assert_eq!(mark(&direct, "orders/9").await, Some(tok(100)));
}
