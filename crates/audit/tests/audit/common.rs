//! Shared helpers: a migrated test database, a pool, requests through a router, polling.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use deadpool_postgres::Pool;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use palisade_testkit::TestDb;
use tower::ServiceExt;

/// A fresh database with the audit schema, and a pool on it.
pub(crate) async fn migrated_db() -> (TestDb, Pool) {
    let db = TestDb::create().await;
    let pool = palisade_audit::pool(&db.connection_string(), 4).unwrap();
    palisade_audit::migrate(&pool).await.unwrap();
    (db, pool)
}

/// An admin connection to the server (not to the test database).
pub(crate) async fn admin() -> tokio_postgres::Client {
    let conn = std::env::var("PALISADE_PG_ADMIN")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=postgres".to_owned());
    let (client, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Refuses new connections to `db` and ends the open ones: the database is "down"
/// while the server keeps serving every other database.
pub(crate) async fn take_down(admin: &tokio_postgres::Client, db: &TestDb) {
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS false",
            db.name()
        ))
        .await
        .unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            &[&db.name()],
        )
        .await
        .unwrap();
    // pg_terminate_backend only signals: wait until the backends are gone.
    eventually("the database's backends to exit", || async {
        count_with(
            admin,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
            db.name(),
        )
        .await
            == 0
    })
    .await;
}

async fn count_with(client: &tokio_postgres::Client, sql: &str, param: &str) -> i64 {
    client.query_one(sql, &[&param]).await.unwrap().get(0)
}

pub(crate) async fn bring_up(admin: &tokio_postgres::Client, db: &TestDb) {
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            db.name()
        ))
        .await
        .unwrap();
}

/// Waits up to 20 s for `check` to hold.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub(crate) async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// A response's status, content type and body text.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) content_type: String,
    pub(crate) body: String,
}

pub(crate) async fn request(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let content_type = res
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    Reply {
        status,
        content_type,
        body,
    }
}

pub(crate) async fn get(app: &Router, uri: &str) -> Reply {
    request(app, Method::GET, uri, &[]).await
}
