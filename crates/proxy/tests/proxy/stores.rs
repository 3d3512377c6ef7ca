//! The durable stores beside Postgres: two proxy replicas on one Redis, and on one
//! MariaDB, give the same verdicts; a store that does not answer is a 503 and `/readyz`
//! says so.

use http::Method;
use palisade_fence::FencingToken;
use palisade_testkit::{TestDb, TestMysqlDb, TestRedis};

use crate::common::{admin, config, rows, send, start, Upstream, ORDERS};

/// Replica a admits 300; b refuses 200 naming 300 and admits 400; a then refuses 300.
/// Only the two admitted writes reach the upstream's table. Returns nothing: the caller
/// reads the mark the store kept.
async fn same_verdicts(store_a: &str, store_b: &str, db: &TestDb, up: &Upstream) {
    let a = start(config(&format!("{store_a}{ORDERS}"), &up.url())).await;
    let b = start(config(&format!("{store_b}{ORDERS}"), &up.url())).await;
    let first = send(a.addr, Method::PUT, "/orders/1", Some("300"), "a").await;
    assert_eq!(first.status, 200, "{}", first.body);
    let refused = send(b.addr, Method::PUT, "/orders/1", Some("200"), "b").await;
    assert_eq!(refused.status, 409, "b knows a's mark: {}", refused.body);
    assert_eq!(refused.json()["highest"], "300");
    let newer = send(b.addr, Method::PUT, "/orders/1", Some("400"), "b2").await;
    assert_eq!(newer.status, 200, "{}", newer.body);
    let back = send(a.addr, Method::PUT, "/orders/1", Some("300"), "a2").await;
    assert_eq!(back.status, 409, "and a knows b's: {}", back.body);
    assert_eq!(back.json()["highest"], "400");
    assert_eq!(
        rows(db).await,
        vec![
            ("1".into(), Some("300".into())),
            ("1".into(), Some("400".into()))
        ]
    );
}

/// A store whose server does not answer: `/readyz` is 503 naming the store, a fenced write
/// is 503 `store-unavailable` and never reaches the upstream.
async fn down(store: &str, kind: &str) {
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let text = format!("admin = \"127.0.0.1:0\"\n{store}{ORDERS}");
    let proxy = start(config(&text, &up.url())).await;
    let (status, body) = admin(proxy.admin.unwrap(), "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(&format!("{kind} store")), "{body}");
    let r = send(proxy.addr, Method::PUT, "/orders/1", Some("5"), "x").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["type"], "urn:palisade:problem:store-unavailable");
    assert!(rows(&db).await.is_empty());
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn two_replicas_on_one_redis_give_the_same_verdicts() {
    let redis = TestRedis::create().await;
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        redis.prefix()
    );
    same_verdicts(&store, &store, &db, &up).await;
    // The mark is where the documented layout puts it, under the configured prefix.
    let kept = palisade_fence::RedisStore::new(redis.manager().await)
        .with_layout(palisade_fence::redis::KeyLayout::new(redis.prefix()).unwrap())
        .mark("orders/1")
        .await
        .unwrap()
        .map(|m| m.token);
    assert_eq!(kept, Some(FencingToken::from_u64(400).unwrap()));
    assert!(
        redis.keys().await.contains(&redis.key("{orders/1}:mark")),
        "{:?}",
        redis.keys().await
    );
}

#[tokio::test]
async fn two_replicas_on_one_mariadb_give_the_same_verdicts() {
    let marks = TestMysqlDb::create().await;
    palisade_fence::mysql::migrate(&mut marks.connect().await)
        .await
        .unwrap();
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    // Replica b names the server as mariadb://, which means the same.
    let a = format!("[store]\nkind = \"mysql\"\nurl = \"{}\"\n", marks.url());
    let b = a.replace("mysql://", "mariadb://");
    same_verdicts(&a, &b, &db, &up).await;
    let kept = palisade_fence::mysql::read_mark(&mut marks.connect().await, "orders/1")
        .await
        .unwrap()
        .map(|m| m.token);
    assert_eq!(kept, Some(FencingToken::from_u64(400).unwrap()));
}

#[tokio::test]
async fn readyz_says_when_the_redis_store_does_not_answer() {
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\n",
        closed_port()
    );
    down(&store, "redis").await;
}

#[tokio::test]
async fn readyz_says_when_the_mariadb_store_does_not_answer() {
    let store = format!(
        "[store]\nkind = \"mysql\"\nurl = \"mysql://root@127.0.0.1:{}/fence\"\n",
        closed_port()
    );
    down(&store, "mysql").await;
}

/// A MariaDB that answers but holds no fence (never migrated) is not ready: every fenced
/// write would fail there.
#[tokio::test]
async fn readyz_says_when_the_mariadb_store_has_no_fence() {
    let bare = TestMysqlDb::create().await;
    let db = TestDb::create().await;
    let up = Upstream::start(&db).await;
    let text = format!(
        "admin = \"127.0.0.1:0\"\n[store]\nkind = \"mysql\"\nurl = \"{}\"\n{ORDERS}",
        bare.url()
    );
    let proxy = start(config(&text, &up.url())).await;
    let (status, body) = admin(proxy.admin.unwrap(), "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no fence_raise procedure"), "{body}");
    let r = send(proxy.addr, Method::PUT, "/orders/1", Some("5"), "x").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(rows(&db).await.is_empty());
}
