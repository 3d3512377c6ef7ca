//! The Redis Function library on the shared Redis (a key prefix per test): every fenced
//! write admits an equal or higher token and refuses a lower one writing nothing, tokens
//! above 2^53 one apart are told apart, malformed tokens are refused, concurrent raisers
//! end at the maximum. Each check runs twice: through FCALL and through the EVALSHA
//! fallback (forced on this Redis 7).

use std::time::Instant;

use palisade_fence::redis::{
    eval_source, read_mark, Dispatch, FencedCall, FencedCommand, KeyLayout, RedisFence,
    RedisFenceError, RedisFenceErrorKind,
};
use palisade_fence::{Epoch, FencingToken, Revision};
use palisade_testkit::TestRedis;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Value};

use crate::common::shuffle;

/// A token of epoch 20000: above 2^53, where a double cannot tell `rev` from `rev + 1`.
pub(crate) fn big(rev: u64) -> FencingToken {
    FencingToken::from_parts(Epoch::new(20_000).unwrap(), Revision::new(rev)).unwrap()
}

/// A prefix of the test's own, a connection, and the fence under that prefix.
pub(crate) struct Env {
    pub(crate) redis: TestRedis,
    pub(crate) conn: ConnectionManager,
    pub(crate) fence: RedisFence,
}

pub(crate) async fn env(dispatch: Dispatch) -> Env {
    let redis = TestRedis::create().await;
    let mut conn = redis.manager().await;
    let fence = match dispatch {
        Dispatch::Functions => RedisFence::load(&mut conn).await.unwrap(),
        _ => RedisFence::eval(),
    }
    .with_layout(KeyLayout::new(redis.prefix()).unwrap());
    assert_eq!(fence.dispatch(), dispatch);
    Env { redis, conn, fence }
}

impl Env {
    pub(crate) async fn mark(&mut self, resource: &str) -> Option<FencingToken> {
        read_mark(&mut self.conn, &self.fence, resource)
            .await
            .unwrap()
            .map(|m| m.token)
    }

    /// A function called by hand, as a client in another language would: `FCALL`, or
    /// `EVALSHA` of the fallback with the name first.
    pub(crate) async fn raw(
        &mut self,
        name: &str,
        keys: &[&str],
        args: &[&str],
    ) -> redis::RedisResult<Value> {
        match self.fence.dispatch() {
            Dispatch::Functions => {
                redis::cmd("FCALL")
                    .arg(name)
                    .arg(keys.len())
                    .arg(keys)
                    .arg(args)
                    .query_async(&mut self.conn)
                    .await
            }
            _ => {
                let script = redis::Script::new(eval_source());
                let mut call = script.prepare_invoke();
                for k in keys {
                    call.key(*k);
                }
                call.arg(name).arg(args);
                call.invoke_async(&mut self.conn).await
            }
        }
    }
}

fn assert_stale(e: &RedisFenceError, resource: &str, token: FencingToken, mark: FencingToken) {
    assert_eq!(e.kind(), RedisFenceErrorKind::Stale, "{e}");
    assert!(e.is_stale() && !e.is_retryable());
    assert_eq!((e.token(), e.highest()), (Some(token), Some(mark)), "{e}");
    assert_eq!(e.resource(), resource);
    let text = e.to_string();
    assert!(
        text.contains(&token.to_string()) && text.contains(&mark.to_string()),
        "{text}"
    );
}

async fn every_write_admits_equal_and_higher_and_refuses_lower(dispatch: Dispatch) {
    let mut env = env(dispatch).await;
    let (fence, mut c) = (env.fence.clone(), env.conn.clone());
    let (t9, t10, t11) = (big(9), big(10), big(11));
    assert_eq!(t10.get() - t9.get(), 1);
    assert!(t9.get() > 1 << 53);

    // SET: the first write is admitted and creates the mark; an equal token writes again.
    let k = env.redis.key("set");
    assert_eq!(env.mark("set").await, None);
    fence.set(&mut c, "set", t10, &k, "a").await.unwrap();
    fence.set(&mut c, "set", t10, &k, "b").await.unwrap();
    let e = fence.set(&mut c, "set", t9, &k, "stale").await.unwrap_err();
    assert_stale(&e, "set", t9, t10);
    assert_eq!(
        c.get::<_, String>(&k).await.unwrap(),
        "b",
        "nothing written"
    );
    assert_eq!(env.mark("set").await, Some(t10));
    fence.set(&mut c, "set", t11, &k, "c").await.unwrap();
    assert_eq!(c.get::<_, String>(&k).await.unwrap(), "c");
    assert_eq!(env.mark("set").await, Some(t11));

    // HSET.
    let k = env.redis.key("hset");
    let added = fence
        .hset(&mut c, "hset", t10, &k, &[("f", "1"), ("g", "2")])
        .await
        .unwrap();
    assert_eq!(added, 2);
    assert_eq!(
        fence
            .hset(&mut c, "hset", t10, &k, &[("f", "3")])
            .await
            .unwrap(),
        0
    );
    let e = fence
        .hset(&mut c, "hset", t9, &k, &[("f", "stale"), ("h", "x")])
        .await
        .unwrap_err();
    assert_stale(&e, "hset", t9, t10);
    let row: Vec<(String, String)> = c.hgetall(&k).await.unwrap();
    let mut row = row;
    row.sort();
    assert_eq!(row, [("f".into(), "3".into()), ("g".into(), "2".into())]);
    assert_eq!(
        fence
            .hset(&mut c, "hset", t11, &k, &[("h", "4")])
            .await
            .unwrap(),
        1
    );
    assert_eq!(env.mark("hset").await, Some(t11));

    // DEL.
    let (k1, k2) = (env.redis.key("del1"), env.redis.key("del2"));
    let _: () = c.set(&k1, "x").await.unwrap();
    let _: () = c.set(&k2, "y").await.unwrap();
    fence.raise(&mut c, "del", t10).await.unwrap();
    let e = fence.del(&mut c, "del", t9, &[&k1, &k2]).await.unwrap_err();
    assert_stale(&e, "del", t9, t10);
    assert!(c.exists::<_, bool>(&k1).await.unwrap() && c.exists::<_, bool>(&k2).await.unwrap());
    assert_eq!(fence.del(&mut c, "del", t10, &[&k1, &k2]).await.unwrap(), 2);
    assert_eq!(fence.del(&mut c, "del", t11, &[&k1]).await.unwrap(), 0);
    assert_eq!(env.mark("del").await, Some(t11));

    // INCRBY.
    let k = env.redis.key("incr");
    assert_eq!(fence.incrby(&mut c, "incr", t10, &k, 5).await.unwrap(), 5);
    assert_eq!(fence.incrby(&mut c, "incr", t10, &k, -2).await.unwrap(), 3);
    let e = fence.incrby(&mut c, "incr", t9, &k, 100).await.unwrap_err();
    assert_stale(&e, "incr", t9, t10);
    assert_eq!(c.get::<_, i64>(&k).await.unwrap(), 3);
    assert_eq!(fence.incrby(&mut c, "incr", t11, &k, 1).await.unwrap(), 4);

    // The general form: every command after one check, replies in order.
    let (row, log) = (env.redis.key("row"), env.redis.key("log"));
    let call = FencedCall::new()
        .command(
            FencedCommand::new("HSET")
                .key(&row)
                .arg("status")
                .arg("paid"),
        )
        .command(
            FencedCommand::new("RPUSH")
                .key(&log)
                .arg("paid")
                .arg("shipped"),
        )
        .command(FencedCommand::new("HGET").key(&row).arg("status"));
    let replies = fence.call(&mut c, "call", t10, &call).await.unwrap();
    assert_eq!(
        replies,
        [
            Value::Int(1),
            Value::Int(2),
            Value::BulkString(b"paid".to_vec())
        ]
    );
    let stale = FencedCall::new()
        .command(
            FencedCommand::new("HSET")
                .key(&row)
                .arg("status")
                .arg("refunded"),
        )
        .command(FencedCommand::new("DEL").key(&log));
    let e = fence.call(&mut c, "call", t9, &stale).await.unwrap_err();
    assert_stale(&e, "call", t9, t10);
    assert_eq!(
        c.hget::<_, _, String>(&row, "status").await.unwrap(),
        "paid"
    );
    assert_eq!(c.llen::<_, i64>(&log).await.unwrap(), 2);
    assert_eq!(env.mark("call").await, Some(t10));
    fence.call(&mut c, "call", t11, &stale).await.unwrap();
    assert_eq!(
        c.hget::<_, _, String>(&row, "status").await.unwrap(),
        "refunded"
    );
    assert!(!c.exists::<_, bool>(&log).await.unwrap());
    assert_eq!(env.mark("call").await, Some(t11));

    // Marks are per resource: "set" is at t11, a new resource admits t9.
    fence
        .set(&mut c, "other", t9, env.redis.key("o"), "v")
        .await
        .unwrap();
    assert_eq!(env.mark("other").await, Some(t9));
}

#[tokio::test]
async fn redis_every_fenced_write_admits_equal_and_higher_refuses_lower_through_fcall() {
    every_write_admits_equal_and_higher_and_refuses_lower(Dispatch::Functions).await;
}

#[tokio::test]
async fn redis_every_fenced_write_admits_equal_and_higher_refuses_lower_through_the_eval_fallback()
{
    every_write_admits_equal_and_higher_and_refuses_lower(Dispatch::Eval).await;
}

/// Tokens from other clients, sent by hand: only canonical decimals in `0..2^63` pass.
/// The reply says FENCETOKEN, and neither the data nor the mark moves.
async fn malformed_tokens_are_refused_writing_nothing(dispatch: Dispatch) {
    let mut env = env(dispatch).await;
    let mark = env.fence.layout().mark_key("m");
    let data = env.redis.key("m-data");
    env.fence
        .set(&mut env.conn.clone(), "m", big(5), &data, "kept")
        .await
        .unwrap();
    for bad in [
        "",
        "-1",
        "+5",
        "007",
        "00",
        " 5",
        "5 ",
        "12a",
        "1e5",
        "5.0",
        "0x10",
        "9223372036854775808",
        "18446744073709551615",
        "99999999999999999999",
        "\u{0665}",
    ] {
        let e = env
            .raw("fenced_set", &[&mark, &data], &[bad, "overwritten"])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("FENCETOKEN"), "{bad:?}: {e}");
        assert!(e.to_string().contains("malformed"), "{e}");
        let e = env.raw("fence_raise", &[&mark], &[bad]).await.unwrap_err();
        assert_eq!(e.code(), Some("FENCETOKEN"), "{bad:?}: {e}");
    }
    let mut c = env.conn.clone();
    assert_eq!(c.get::<_, String>(&data).await.unwrap(), "kept");
    assert_eq!(env.mark("m").await, Some(big(5)));
    // The largest token passes; "0" is canonical.
    let max = FencingToken::MAX.to_string();
    assert_eq!(max, "9223372036854775807");
    assert_eq!(
        env.raw("fence_raise", &[&mark], &[&max]).await.unwrap(),
        Value::Int(1)
    );
    assert_eq!(env.mark("m").await, Some(FencingToken::MAX));
    let zero = env.fence.layout().mark_key("zero");
    assert_eq!(
        env.raw("fence_raise", &[&zero], &["0"]).await.unwrap(),
        Value::Int(1)
    );
    // A stale reply names the mark, the token and the key, in that order.
    let e = env
        .raw("fenced_set", &[&mark, &data], &["9223372036854775806", "x"])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("FENCESTALE"));
    assert_eq!(
        e.detail(),
        Some(format!("mark={max} token=9223372036854775806 key={mark}").as_str())
    );
    // Wrong shapes: FENCEARGS, nothing written.
    for (name, keys, args) in [
        ("fenced_set", vec![mark.as_str()], vec!["1", "v"]),
        (
            "fenced_set",
            vec![mark.as_str(), mark.as_str()],
            vec![max.as_str(), "v"],
        ),
        (
            "fenced_hset",
            vec![mark.as_str(), data.as_str()],
            vec![max.as_str(), "f"],
        ),
        ("fenced_del", vec![mark.as_str()], vec![max.as_str()]),
        (
            "fenced_call",
            vec![mark.as_str(), data.as_str()],
            vec![max.as_str(), "3", "SET", data.as_str()],
        ),
        (
            "fenced_call",
            vec![mark.as_str()],
            vec![max.as_str(), "2", "DEL", mark.as_str()],
        ),
        ("fence_raise", vec![mark.as_str()], vec![]),
    ] {
        let e = env.raw(name, &keys, &args).await.unwrap_err();
        assert_eq!(e.code(), Some("FENCEARGS"), "{name} {keys:?} {args:?}: {e}");
    }
    assert_eq!(c.get::<_, String>(&data).await.unwrap(), "kept");
    assert_eq!(env.mark("m").await, Some(FencingToken::MAX));
}

#[tokio::test]
async fn redis_malformed_tokens_and_wrong_shapes_are_refused_writing_nothing_through_fcall() {
    malformed_tokens_are_refused_writing_nothing(Dispatch::Functions).await;
}

#[tokio::test]
async fn redis_malformed_tokens_and_wrong_shapes_are_refused_writing_nothing_through_the_eval_fallback(
) {
    malformed_tokens_are_refused_writing_nothing(Dispatch::Eval).await;
}

/// A write that Redis itself refuses (WRONGTYPE) under a newer token leaves the mark
/// where it was; a mark key that holds no token refuses every write.
async fn refused_writes_and_corrupt_marks_change_nothing(dispatch: Dispatch) {
    let env = env(dispatch).await;
    let (fence, mut c) = (env.fence.clone(), env.conn.clone());
    let k = env.redis.key("string");
    fence.set(&mut c, "w", big(1), &k, "s").await.unwrap();
    let e = fence
        .hset(&mut c, "w", big(2), &k, &[("f", "v")])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::Redis, "{e}");
    assert_eq!(e.resource(), "w");
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.contains("WRONGTYPE"), "{source}");
    let mut env = env;
    assert_eq!(env.mark("w").await, Some(big(1)), "the mark did not rise");

    let mark = env.fence.layout().mark_key("bad");
    let _: () = c.hset(&mark, "token", "not a token").await.unwrap();
    let e = fence.set(&mut c, "bad", big(9), &k, "x").await.unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::CorruptMark, "{e}");
    assert_eq!(c.get::<_, String>(&k).await.unwrap(), "s");
    let _: () = c.del(&mark).await.unwrap();
    let _: () = c.set(&mark, "7").await.unwrap();
    let e = fence.raise(&mut c, "bad", big(9)).await.unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::Redis, "a string mark: {e}");
    assert_eq!(c.get::<_, String>(&mark).await.unwrap(), "7");
}

#[tokio::test]
async fn redis_refused_writes_and_corrupt_marks_change_nothing_through_fcall() {
    refused_writes_and_corrupt_marks_change_nothing(Dispatch::Functions).await;
}

#[tokio::test]
async fn redis_refused_writes_and_corrupt_marks_change_nothing_through_the_eval_fallback() {
    refused_writes_and_corrupt_marks_change_nothing(Dispatch::Eval).await;
}

/// Many tasks on several connections raise one resource with shuffled tokens (above 2^53,
/// neighbours one apart). The final mark is the maximum, and no raise was admitted below
/// what a raise that completed before it started had left.
async fn concurrent_raisers_end_at_the_max(dispatch: Dispatch) {
    let mut env = env(dispatch).await;
    let mut tokens: Vec<FencingToken> = (0..400).map(|i| big(1_000 + i)).collect();
    shuffle(&mut tokens, 0x5eed);
    let mut conns = vec![env.conn.clone()];
    for _ in 0..3 {
        conns.push(env.redis.manager().await);
    }
    let mut tasks = Vec::new();
    for (i, chunk) in tokens.chunks(10).enumerate() {
        let (fence, mut conn) = (env.fence.clone(), conns[i % conns.len()].clone());
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for t in chunk {
                let start = Instant::now();
                let outcome = fence.raise(&mut conn, "race", t).await;
                let left = match outcome {
                    Ok(_) => (true, t),
                    Err(e) => (false, e.highest().expect("only stale refusals")),
                };
                seen.push((start, Instant::now(), t, left));
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let max = *tokens.iter().max().unwrap();
    assert_eq!(env.mark("race").await, Some(max));
    let admitted = all.iter().filter(|r| r.3 .0).count();
    assert!(admitted >= 1 && admitted < all.len(), "{admitted}");
    for (start, _, token, (ok, _)) in &all {
        if !ok {
            continue;
        }
        let floor = all
            .iter()
            .filter(|(_, end, _, _)| end < start)
            .map(|(_, _, _, (_, left))| *left)
            .max();
        if let Some(floor) = floor {
            assert!(*token >= floor, "{token} admitted after {floor} was left");
        }
    }
    for (_, _, token, (ok, left)) in &all {
        if !ok {
            assert!(left > token, "refused {token} with mark {left}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_concurrent_raisers_end_at_the_max_through_fcall() {
    concurrent_raisers_end_at_the_max(Dispatch::Functions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_concurrent_raisers_end_at_the_max_through_the_eval_fallback() {
    concurrent_raisers_end_at_the_max(Dispatch::Eval).await;
}
