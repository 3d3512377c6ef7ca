//! A writer that aims the library at what it must not touch: another resource's mark or
//! reset log, keys no argument names, a reset log of the wrong type, a first key that is
//! not a mark; and a library loaded under the fence's name that is not the fence's code.
//! Each is refused with FENCEARGS or FENCERESET, and every mark and log stays as it was.

use palisade_fence::redis::{Dispatch, RedisFence, RedisFenceErrorKind, LIBRARY_VERSION};
use palisade_fence::{HighWaterStore, RedisStore};
use palisade_testkit::{RedisPersistence, RedisServer};
use redis::AsyncCommands;

use crate::redis_fence::{big, env};

/// The refusal's code, the first word of Redis's error.
fn code(result: redis::RedisResult<redis::Value>) -> String {
    let e = result.expect_err("the call was refused");
    e.code().unwrap_or_default().to_owned()
}

async fn no_write_reaches_a_fence_key_or_a_key_it_does_not_name(dispatch: Dispatch) {
    let mut env = env(dispatch).await;
    let (fence, mut c) = (env.fence.clone(), env.conn.clone());
    let p = env.redis.prefix().to_owned();
    let (a, b) = (format!("{p}{{a}}:mark"), format!("{p}{{b}}:mark"));
    let b_log = format!("{p}{{b}}:resets");
    fence.raise(&mut c, "b", big(500)).await.unwrap();
    fence.raise(&mut c, "a", big(1)).await.unwrap();
    let t = big(900).to_string();
    let data = format!("{p}{{a}}:data");

    // Another resource's mark or log, as a data key or inside a command.
    for (name, keys, args) in [
        ("fenced_set", vec![&a, &b], vec![t.as_str(), "0"]),
        ("fenced_hset", vec![&a, &b], vec![t.as_str(), "token", "0"]),
        ("fenced_del", vec![&a, &b], vec![t.as_str()]),
        ("fenced_incrby", vec![&a, &b], vec![t.as_str(), "-1"]),
        ("fenced_set", vec![&a, &b_log], vec![t.as_str(), "x"]),
        (
            "fenced_call",
            vec![&a, &b],
            vec![t.as_str(), "4", "HSET", b.as_str(), "token", "0"],
        ),
        (
            "fenced_call",
            vec![&a, &data],
            vec![t.as_str(), "3", "RENAME", data.as_str(), b.as_str()],
        ),
        (
            "fenced_call",
            vec![&a],
            vec![t.as_str(), "5", "XADD", b_log.as_str(), "*", "old", "1"],
        ),
        // Commands that reach keys no argument names.
        ("fenced_call", vec![&a], vec![t.as_str(), "1", "FLUSHDB"]),
        ("fenced_call", vec![&a], vec![t.as_str(), "1", "flushall"]),
        (
            "fenced_call",
            vec![&a],
            vec![t.as_str(), "3", "SWAPDB", "0", "1"],
        ),
        (
            "fenced_call",
            vec![&a],
            vec![t.as_str(), "2", "SELECT", "1"],
        ),
        (
            "fenced_call",
            vec![&a],
            vec![t.as_str(), "3", "FUNCTION", "FLUSH", "SYNC"],
        ),
        // A first key that is not named as a mark.
        ("fenced_set", vec![&data, &data], vec!["1", "x"]),
        ("fence_raise", vec![&data], vec!["1"]),
    ] {
        let keys: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let refused = code(env.raw(name, &keys, &args).await);
        assert_eq!(refused, "FENCEARGS", "{name} {keys:?} {args:?}");
    }
    assert_eq!(env.mark("b").await, Some(big(500)));
    assert_eq!(
        env.mark("a").await,
        Some(big(1)),
        "a refused call raises nothing"
    );
    assert!(!c.exists::<_, bool>(&b_log).await.unwrap());
    assert!(!c.exists::<_, bool>(&data).await.unwrap());
}

#[tokio::test]
async fn redis_no_write_reaches_a_fence_key_or_unnamed_keys_through_fcall() {
    no_write_reaches_a_fence_key_or_a_key_it_does_not_name(Dispatch::Functions).await
}

#[tokio::test]
async fn redis_no_write_reaches_a_fence_key_or_unnamed_keys_through_the_eval_fallback() {
    no_write_reaches_a_fence_key_or_a_key_it_does_not_name(Dispatch::Eval).await
}

/// A reset takes the mark's own log only, and a log it cannot append to leaves the mark
/// as it was (the record is written first).
#[tokio::test]
async fn redis_a_reset_that_cannot_be_logged_changes_nothing() {
    let mut env = env(Dispatch::Functions).await;
    let (fence, mut c) = (env.fence.clone(), env.conn.clone());
    let p = env.redis.prefix().to_owned();
    let (mark, log) = (format!("{p}{{r}}:mark"), format!("{p}{{r}}:resets"));
    let other_log = format!("{p}{{s}}:resets");
    fence.raise(&mut c, "r", big(5000)).await.unwrap();
    let t = big(2000).to_string();
    let args = [t.as_str(), "operator reset", "ops", "", ""];
    for keys in [[&mark, &other_log], [&mark, &mark]] {
        let keys: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            code(env.raw("fence_reset", &keys, &args).await),
            "FENCEARGS"
        );
    }
    let _: () = c.set(&log, "not-a-stream").await.unwrap();
    assert_eq!(
        code(env.raw("fence_reset", &[&mark, &log], &args).await),
        "FENCERESET"
    );
    assert_eq!(env.mark("r").await, Some(big(5000)));
    assert!(!c.exists::<_, bool>(&other_log).await.unwrap());
}

/// A library loaded under the fence's name that reports the fence's version but is not its
/// code is refused, and a store on that server fails closed rather than admit.
#[tokio::test]
async fn redis_a_library_that_only_claims_the_fences_version_is_refused() {
    let server = RedisServer::start(RedisPersistence::None).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = redis::aio::ConnectionManager::new(client).await.unwrap();
    let impostor = format!(
        "#!lua name=palisade_fence\n\
         redis.register_function{{function_name='fence_version', callback=function() return {LIBRARY_VERSION} end, flags={{'no-writes'}}}}\n\
         redis.register_function{{function_name='fence_raise', callback=function() return 1 end}}\n"
    );
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&impostor)
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = RedisFence::load(&mut conn).await.unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::Library, "{e}");
    assert!(e.to_string().contains("not this client's"), "{e}");
    let store = RedisStore::new(conn.clone());
    assert!(store.raise("orders/1", big(1)).await.is_err());
    // The fence's own code, loaded by an operator, is accepted again.
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(palisade_fence::redis::LIBRARY)
        .query_async(&mut conn)
        .await
        .unwrap();
    RedisFence::load(&mut conn).await.unwrap();
}
