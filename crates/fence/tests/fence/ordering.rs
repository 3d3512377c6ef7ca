//! The ordering claims of the layer's module docs, over real HTTP and a real database:
//! the layer alone orders admissions, not effects; the Postgres helper orders effects.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::put;
use axum::{Extension, Router};
use http::Method;
use palisade_fence::{
    fenced_transaction, FenceError, FenceLayer, FencingToken, PostgresStore, VerifiedToken,
};
use palisade_testkit::TestDb;
use tokio::sync::{Barrier, Notify, Semaphore};

use crate::common::{client, pause, send, serve, shuffle, stagger, tok};
use crate::postgres_helper::{check_log, fresh_db, mark, LOG_TABLE};

#[derive(Clone)]
struct AppState {
    conn: String,
    /// Open connections, so a handler's write follows its admission closely.
    pool: Arc<std::sync::Mutex<Vec<tokio_postgres::Client>>>,
    /// A request with token `hold_at` signals `entered`, then waits for a `gate` permit.
    hold_at: Option<FencingToken>,
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
}

async fn connect(conn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

impl AppState {
    async fn client(&self) -> tokio_postgres::Client {
        let pooled = self.pool.lock().unwrap().pop();
        match pooled {
            Some(c) => c,
            None => connect(&self.conn).await,
        }
    }

    fn give_back(&self, c: tokio_postgres::Client) {
        self.pool.lock().unwrap().push(c);
    }

    async fn maybe_hold(&self, token: FencingToken) {
        if self.hold_at == Some(token) {
            self.entered.notify_one();
            self.gate.acquire().await.unwrap().forget();
        }
    }
}

/// Writes through the helper: the check is repeated in the write's transaction.
async fn fenced_write(
    State(state): State<AppState>,
    Extension(v): Extension<VerifiedToken>,
) -> (StatusCode, &'static str) {
    state.maybe_hold(v.token).await;
    let mut c = state.client().await;
    let token = v.token;
    let r = fenced_transaction(&mut c, &v.resource, token, |tx| {
        Box::pin(async move {
            // Sleep between the check and the write, 0-6 ms by token: the window a non-atomic check would lose.
            tx.execute("SELECT pg_sleep($1)", &[&pause(token)]).await?;
            tx.execute("INSERT INTO write_log (token) VALUES ($1)", &[&token])
                .await?;
            Ok::<_, FenceError>(())
        })
    })
    .await;
    state.give_back(c);
    match r {
        Ok(()) => (StatusCode::OK, "written"),
        Err(e) if e.is_stale() => (StatusCode::CONFLICT, "stale in transaction"),
        Err(e) => panic!("{e:?}"),
    }
}

/// Writes without the helper: relies on the layer's check alone.
async fn plain_write(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Extension(v): Extension<VerifiedToken>,
) -> StatusCode {
    state.maybe_hold(v.token).await;
    let c = state.client().await;
    c.execute(
        "INSERT INTO plain_log (id, token) VALUES ($1, $2)",
        &[&id, &v.token],
    )
    .await
    .unwrap();
    state.give_back(c);
    StatusCode::OK
}

async fn instance(db: &TestDb, hold_at: Option<FencingToken>) -> (std::net::SocketAddr, AppState) {
    let mut pool = Vec::new();
    for _ in 0..16 {
        pool.push(db.connect().await);
    }
    let state = AppState {
        conn: db.connection_string(),
        pool: Arc::new(std::sync::Mutex::new(pool)),
        hold_at,
        entered: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
    };
    let store = PostgresStore::new(Arc::new(db.connect().await));
    let app = Router::new()
        .route("/fenced/{id}", put(fenced_write))
        .route("/plain/{id}", put(plain_write))
        .with_state(state.clone())
        .layer(FenceLayer::new(store));
    (serve(app).await, state)
}

/// Two instances of one service, sharing one database through PostgresStore; 32
/// concurrent writers with shuffled tokens on one resource, alternating instances; once
/// all at once, once staggered so that more of them commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sharing_postgres_commit_in_token_order() {
    for (staggered, seed) in [(false, 0), (true, 7), (true, 8), (true, 9)] {
        two_instances_round(staggered, seed).await;
    }
}

async fn two_instances_round(staggered: bool, seed: u64) {
    let (db, admin) = fresh_db().await;
    admin.batch_execute(LOG_TABLE).await.unwrap();
    let (a, _) = instance(&db, None).await;
    let (b, _) = instance(&db, None).await;
    let mut tokens: Vec<FencingToken> = (0..32).map(|i| tok(5_000 + 3 * i)).collect();
    shuffle(&mut tokens, 0x5eed + seed);
    let barrier = Arc::new(Barrier::new(tokens.len()));
    let c = client();
    let mut tasks = Vec::new();
    for (i, &token) in tokens.iter().enumerate() {
        let (c, barrier) = (c.clone(), Arc::clone(&barrier));
        let addr = if i % 2 == 0 { a } else { b };
        let delay = if staggered {
            stagger(&tokens, token, 10, seed)
        } else {
            std::time::Duration::ZERO
        };
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            tokio::time::sleep(delay).await;
            (
                token,
                send(
                    &c,
                    Method::PUT,
                    addr,
                    "/fenced/account-1",
                    &[&token.to_string()],
                )
                .await,
            )
        }));
    }
    let mut admitted = Vec::new();
    for t in tasks {
        let (token, reply) = t.await.unwrap();
        match reply.status {
            StatusCode::OK => admitted.push(token),
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other} for {token}"),
        }
    }
    eprintln!(
        "staggered {staggered}: admitted {} of {}",
        admitted.len(),
        tokens.len()
    );
    check_log(&admin, &admitted).await;
    let max = *tokens.iter().max().unwrap();
    assert!(admitted.contains(&max));
    assert_eq!(mark(&admin, "/fenced/account-1").await, Some(max));
}

/// Token 5 is admitted by the layer and its handler stalls; token 7 is admitted and
/// written; then 5's handler resumes. Without the helper 5's write lands after 7's (the
/// layer alone does not order effects); with the helper it is refused as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_orders_admissions_only_and_the_helper_orders_writes() {
    let (db, admin) = fresh_db().await;
    admin.batch_execute(LOG_TABLE).await.unwrap();
    admin
        .batch_execute("CREATE TABLE plain_log (seq bigserial PRIMARY KEY, id text, token bigint)")
        .await
        .unwrap();
    let (addr, state) = instance(&db, Some(tok(5))).await;
    let c = client();
    for route in ["/plain/x", "/fenced/y"] {
        let slow = {
            let c = c.clone();
            tokio::spawn(
                async move { send(&c, Method::PUT, addr, route, &[&tok(5).to_string()]).await },
            )
        };
        state.entered.notified().await; // 5 passed the layer
        let fast = send(&c, Method::PUT, addr, route, &[&tok(7).to_string()]).await;
        assert_eq!(fast.status, StatusCode::OK);
        state.gate.add_permits(1);
        let slow = slow.await.unwrap();
        if route == "/plain/x" {
            assert_eq!(
                slow.status,
                StatusCode::OK,
                "the layer alone admitted 5 before 7 arrived"
            );
            let logged: Vec<FencingToken> = admin
                .query("SELECT token FROM plain_log ORDER BY seq", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            assert_eq!(logged, vec![tok(7), tok(5)], "5's write landed after 7's");
        } else {
            assert_eq!(
                (slow.status, slow.text()),
                (StatusCode::CONFLICT, "stale in transaction".to_owned())
            );
            check_log(&admin, &[tok(7)]).await;
        }
    }
}

/// With MemoryStore the order is per process: each replica keeps its own marks.
#[tokio::test]
async fn memory_store_orders_admissions_per_process_only() {
    let app = || {
        Router::new()
            .route("/r", put(|| async { "ok" }))
            .layer(FenceLayer::new(palisade_fence::MemoryStore::new(100)))
    };
    let (a, b) = (serve(app()).await, serve(app()).await);
    let c = client();
    assert_eq!(
        send(&c, Method::PUT, a, "/r", &[&tok(7).to_string()])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(&c, Method::PUT, a, "/r", &[&tok(5).to_string()])
            .await
            .status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        send(&c, Method::PUT, b, "/r", &[&tok(5).to_string()])
            .await
            .status,
        StatusCode::OK,
        "another process has its own mark"
    );
}
