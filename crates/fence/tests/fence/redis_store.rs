//! `RedisStore`: the raise behind `FenceLayer` (409 for a stale token, 503 when Redis is
//! down, never an admit), shared with the fenced writes, and what a crash keeps: a mark
//! survives SIGKILL with AOF `appendfsync always`, and is lost without persistence.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::put;
use axum::Router;
use http::{Method, StatusCode};
use palisade_fence::redis::{
    load_library, read_mark, Dispatch, KeyLayout, LibraryLoad, RedisFence, RedisFenceError,
    RedisFenceErrorKind,
};
use palisade_fence::{FenceLayer, FencingToken, HighWaterStore, Raise, RedisStore};
use palisade_testkit::{RedisPersistence, RedisServer, TestRedis};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;

use crate::common::{client, send, serve, tok};
use crate::redis_fence::big;

/// A handler that counts the writes that reached it.
fn counting_app(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/{*path}",
        put(move || {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                "written"
            }
        }),
    )
}

async fn store_on(redis: &TestRedis, dispatch: Dispatch) -> RedisStore {
    let layout = KeyLayout::new(redis.prefix()).unwrap();
    match dispatch {
        Dispatch::Functions => RedisStore::new(redis.manager().await).with_layout(layout),
        _ => RedisStore::with_fence(
            redis.manager().await,
            RedisFence::eval().with_layout(layout),
        ),
    }
}

async fn store_behind_the_layer(dispatch: Dispatch) {
    let redis = TestRedis::create().await;
    let store = store_on(&redis, dispatch).await;
    assert_eq!(
        store.raise("/direct", big(7)).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        store.raise("/direct", big(7)).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        store.raise("/direct", big(6)).await.unwrap(),
        Raise::Stale { highest: big(7) }
    );
    assert_eq!(store.fence().await.unwrap().dispatch(), dispatch);

    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting_app(Arc::clone(&calls)).layer(FenceLayer::new(store.clone()))).await;
    let c = client();
    let r = send(&c, Method::PUT, addr, "/orders/1", &[&big(10).to_string()]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(&c, Method::PUT, addr, "/orders/1", &[&big(10).to_string()]).await;
    assert_eq!(r.status, StatusCode::OK, "an equal token is admitted");
    let r = send(&c, Method::PUT, addr, "/orders/1", &[&big(9).to_string()]).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let doc = r.json();
    assert_eq!(doc["type"], "urn:palisade:problem:stale-token", "{doc}");
    assert_eq!(doc["highest"], big(10).to_string(), "{doc}");
    assert_eq!(doc["token"], big(9).to_string(), "{doc}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the stale write never reached the handler"
    );

    // One mark for the layer and the fenced writes: a direct Redis write under the
    // refused token is refused too.
    let fence = store.fence().await.unwrap();
    let mut conn = store.connection();
    let key = redis.key("order-1");
    let e = fence
        .set(&mut conn, "/orders/1", big(9), &key, "stale")
        .await
        .unwrap_err();
    assert_eq!(e.highest(), Some(big(10)));
    assert!(!conn.exists::<_, bool>(&key).await.unwrap());
    let mark = store.mark("/orders/1").await.unwrap().unwrap();
    assert_eq!(mark.token, big(10));
    assert_eq!(
        redis.keys().await,
        [
            KeyLayout::new(redis.prefix()).unwrap().mark_key("/direct"),
            KeyLayout::new(redis.prefix())
                .unwrap()
                .mark_key("/orders/1"),
        ]
    );
}

#[tokio::test]
async fn redis_store_behind_fence_layer_admits_equal_and_answers_409_for_stale_through_fcall() {
    store_behind_the_layer(Dispatch::Functions).await;
}

#[tokio::test]
async fn redis_store_behind_fence_layer_admits_equal_and_answers_409_for_stale_through_the_eval_fallback(
) {
    store_behind_the_layer(Dispatch::Eval).await;
}

/// A manager that gives up fast: one reconnect attempt, short timeouts.
fn quick(url: &str) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)));
    ConnectionManager::new_lazy_with_config(redis::Client::open(url).unwrap(), config).unwrap()
}

async fn assert_503(store: RedisStore, calls: &Arc<AtomicUsize>) {
    let e = store.raise("/x", tok(3)).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let source = std::error::Error::source(&e).unwrap();
    let fence_error = source.downcast_ref::<RedisFenceError>().unwrap();
    assert_eq!(
        fence_error.kind(),
        RedisFenceErrorKind::Unavailable,
        "{fence_error}"
    );
    let before = calls.load(Ordering::SeqCst);
    let addr = serve(counting_app(Arc::clone(calls)).layer(FenceLayer::new(store))).await;
    let r = send(&client(), Method::PUT, addr, "/x", &[&tok(3).to_string()]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.json()["type"], "urn:palisade:problem:store-unavailable");
    assert_eq!(calls.load(Ordering::SeqCst), before, "never an admit");
}

#[tokio::test]
async fn redis_store_down_fails_closed_with_503_on_a_closed_port_and_a_killed_server() {
    let calls = Arc::new(AtomicUsize::new(0));
    // Nothing listens: the library cannot even be loaded.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    assert_503(
        RedisStore::new(quick(&format!("redis://127.0.0.1:{port}"))),
        &calls,
    )
    .await;
    let e = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::Unavailable, "{e}");

    // A server that answered, then was killed: 503 while it is down, then (restarted
    // empty, without persistence) the store reloads the library and admits again.
    let mut server = RedisServer::start(RedisPersistence::None).await.unwrap();
    let store = RedisStore::new(quick(&server.url()));
    assert_eq!(store.raise("/x", tok(2)).await.unwrap(), Raise::Admitted);
    server.kill().unwrap();
    assert_503(store.clone(), &calls).await;
    server.start_again().await.unwrap();
    let mut admitted = false;
    for _ in 0..50 {
        if let Ok(Raise::Admitted) = store.raise("/x", tok(3)).await {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "the store recovers once Redis is back");
}

/// What a crash keeps of a mark (SIGKILL: no shutdown, no final save).
struct AfterCrash {
    /// What loading the library found (persisted with the data, or not).
    library: LibraryLoad,
    mark: Option<FencingToken>,
    /// A write under a token below the mark the crash may have lost.
    stale_write: Result<(), RedisFenceError>,
    balance: Option<String>,
}

async fn after_a_crash(persistence: RedisPersistence) -> AfterCrash {
    let mut server = RedisServer::start(persistence).await.unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let fence = store.fence().await.unwrap();
    let mut c = store.connection();
    fence
        .set(&mut c, "acct/1", big(7), "{acct/1}:balance", "70")
        .await
        .unwrap();
    server.kill().unwrap();
    server.start_again().await.unwrap();
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let library = load_library(&mut c).await.unwrap();
    let fence = RedisFence::load(&mut c).await.unwrap();
    let mark = read_mark(&mut c, &fence, "acct/1")
        .await
        .unwrap()
        .map(|m| m.token);
    let stale_write = fence
        .set(&mut c, "acct/1", big(6), "{acct/1}:balance", "60")
        .await;
    let balance: Option<String> = c.get("{acct/1}:balance").await.unwrap();
    AfterCrash {
        library,
        mark,
        stale_write,
        balance,
    }
}

#[tokio::test]
async fn redis_a_mark_survives_sigkill_with_aof_always_and_a_stale_write_is_still_refused() {
    let after = after_a_crash(RedisPersistence::AofAlways).await;
    assert_eq!(
        after.library,
        LibraryLoad::Current,
        "the library is persisted too"
    );
    assert_eq!(after.mark, Some(big(7)));
    let e = after.stale_write.unwrap_err();
    assert_eq!(
        (e.kind(), e.highest()),
        (RedisFenceErrorKind::Stale, Some(big(7)))
    );
    assert_eq!(
        after.balance.as_deref(),
        Some("70"),
        "the stale write wrote nothing"
    );
}

/// The documented failure mode: without persistence a restart forgets the mark (and the
/// library), and the stale token it refused before is admitted.
#[tokio::test]
async fn redis_without_persistence_a_sigkill_loses_the_mark_and_readmits_a_stale_token() {
    let after = after_a_crash(RedisPersistence::None).await;
    assert_eq!(after.library, LibraryLoad::Loaded);
    assert_eq!(after.mark, None);
    assert!(after.stale_write.is_ok());
    assert_eq!(after.balance.as_deref(), Some("60"));
}
