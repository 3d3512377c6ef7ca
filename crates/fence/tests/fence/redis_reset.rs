//! Resets of a Redis mark (only lower, to a named token, with a reason, above the lock's
//! floor, logged in the same call, `reset_by` the connection's ACL user), and loading the
//! library (version-checked, reloaded when a server lost it).

use std::time::{Duration, SystemTime};

use palisade_fence::redis::{
    load_library, read_mark, read_resets, reset_mark, reset_mark_guarded, Dispatch, KeyLayout,
    LibraryLoad, RedisFence, RedisFenceErrorKind, LIBRARY, LIBRARY_VERSION,
};
use palisade_fence::ResetGuard;
use palisade_testkit::{RedisPersistence, RedisServer};
use redis::AsyncCommands;

use crate::redis_fence::{big, env};

async fn reset_rules_and_log(dispatch: Dispatch) {
    let mut env = env(dispatch).await;
    let (fence, mut c) = (env.fence.clone(), env.conn.clone());
    let started = SystemTime::now() - Duration::from_secs(1);

    let e = reset_mark(&mut c, &fence, "r", big(1), "typo")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::NoMark, "{e}");
    assert!(
        e.to_string().contains("no mark") && e.to_string().contains("\"r\""),
        "{e}"
    );

    fence.raise(&mut c, "r", big(100)).await.unwrap();
    let refused = [
        (
            big(100),
            "equal",
            ResetGuard::LockUnknown,
            "not below the mark",
        ),
        (
            big(101),
            "higher",
            ResetGuard::LockUnknown,
            "not below the mark",
        ),
        (
            big(50),
            " \t",
            ResetGuard::LockUnknown,
            "reason is required",
        ),
        (
            big(40),
            "below floor",
            ResetGuard::lock("ns/class/key", big(50)),
            "below",
        ),
    ];
    for (to, reason, guard, says) in refused {
        let e = reset_mark_guarded(&mut c, &fence, "r", to, reason, &guard)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), RedisFenceErrorKind::BadReset, "{reason}: {e}");
        assert!(e.to_string().contains(says), "{reason}: {e}");
    }
    assert_eq!(
        env.mark("r").await,
        Some(big(100)),
        "refusals change nothing"
    );
    assert!(read_resets(&mut c, &fence, "r", 10)
        .await
        .unwrap()
        .is_empty());

    // At the floor is allowed; the old mark comes back.
    let guard = ResetGuard::lock("ns/class/key", big(60));
    let old = reset_mark_guarded(&mut c, &fence, "r", big(60), "epoch-1 typo", &guard)
        .await
        .unwrap();
    assert_eq!(old, big(100));
    assert_eq!(env.mark("r").await, Some(big(60)));
    let e = fence.raise(&mut c, "r", big(59)).await.unwrap_err();
    assert_eq!(e.highest(), Some(big(60)), "the new mark refuses below it");
    assert!(fence.raise(&mut c, "r", big(60)).await.is_ok());
    let old = reset_mark(&mut c, &fence, "r", big(55), "again")
        .await
        .unwrap();
    assert_eq!(old, big(60));

    let log = read_resets(&mut c, &fence, "r", 10).await.unwrap();
    assert_eq!(log.len(), 2, "{log:?}");
    let (newest, first) = (&log[0], &log[1]);
    assert_eq!(
        (newest.old, newest.new, newest.reason.as_str()),
        (big(60), big(55), "again")
    );
    assert_eq!(newest.lock, None);
    assert_eq!((first.old, first.new), (big(100), big(60)));
    assert_eq!(first.reason, "epoch-1 typo");
    assert_eq!(first.lock, Some(("ns/class/key".to_owned(), big(60))));
    for r in &log {
        assert_eq!(r.reset_by, "default", "the connection's ACL user");
        assert!(r.reset_at >= started && r.reset_at <= SystemTime::now());
    }
    assert!(newest.reset_at >= first.reset_at);
    assert_eq!(read_resets(&mut c, &fence, "r", 1).await.unwrap(), log[..1]);
    assert!(read_resets(&mut c, &fence, "r", 0)
        .await
        .unwrap()
        .is_empty());
    let mark = read_mark(&mut c, &fence, "r").await.unwrap().unwrap();
    assert_eq!(mark.token, big(55));
    assert!(mark.updated_at >= first.reset_at);
    // The log key is where the layout says.
    let len: i64 = redis::cmd("XLEN")
        .arg(
            KeyLayout::new(env.redis.prefix())
                .unwrap()
                .reset_log_key("r"),
        )
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(len, 2);
}

#[tokio::test]
async fn redis_a_reset_only_lowers_needs_a_reason_respects_the_floor_and_is_logged_through_fcall() {
    reset_rules_and_log(Dispatch::Functions).await;
}

#[tokio::test]
async fn redis_a_reset_only_lowers_needs_a_reason_respects_the_floor_and_is_logged_through_the_eval_fallback(
) {
    reset_rules_and_log(Dispatch::Eval).await;
}

/// `reset_by` is the ACL user the connection authenticated as (a user made for this
/// test on a private server).
#[tokio::test]
async fn redis_reset_by_is_the_connections_acl_user() {
    let server = RedisServer::start(RedisPersistence::None).await.unwrap();
    let admin = redis::Client::open(server.url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "fence-operator", "on", ">s3cret", "~*", "+@all"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://fence-operator:s3cret@127.0.0.1:{}", server.port());
    let mut c = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let fence = RedisFence::load(&mut c).await.unwrap();
    fence.raise(&mut c, "acct", big(9)).await.unwrap();
    reset_mark(&mut c, &fence, "acct", big(3), "operator fix")
        .await
        .unwrap();
    let log = read_resets(&mut admin, &fence, "acct", 5).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].reset_by, "fence-operator");
}

/// The library is loaded once, replaced when older, refused when newer; a server that
/// lost it (`FUNCTION FLUSH`, a restart without persistence) gets it again on the next
/// call.
#[tokio::test]
async fn redis_the_library_is_version_checked_and_reloaded_when_lost() {
    let server = RedisServer::start(RedisPersistence::None).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    assert_eq!(load_library(&mut c).await.unwrap(), LibraryLoad::Loaded);
    assert_eq!(load_library(&mut c).await.unwrap(), LibraryLoad::Current);

    let with_version = |v: i64| {
        LIBRARY.replace(
            &format!("\nlocal VERSION = {LIBRARY_VERSION}\n"),
            &format!("\nlocal VERSION = {v}\n"),
        )
    };
    let load = |source: String| {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(source);
        cmd
    };
    let _: String = load(with_version(LIBRARY_VERSION - 1))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        load_library(&mut c).await.unwrap(),
        LibraryLoad::Replaced {
            from: LIBRARY_VERSION - 1
        }
    );
    let _: String = load(with_version(LIBRARY_VERSION + 1))
        .query_async(&mut c)
        .await
        .unwrap();
    let e = load_library(&mut c).await.unwrap_err();
    assert_eq!(e.kind(), RedisFenceErrorKind::Library, "{e}");
    assert!(e.to_string().contains("newer"), "{e}");
    let v: i64 = redis::cmd("FCALL_RO")
        .arg(&["fence_version", "0"][..])
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, LIBRARY_VERSION + 1, "a newer library is left alone");

    // Lost: the next fenced write loads it and goes through.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();
    let fence = RedisFence::load(&mut c).await.unwrap();
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();
    fence
        .set(&mut c, "lost", big(4), "{lost}:k", "v")
        .await
        .unwrap();
    assert_eq!(load_library(&mut c).await.unwrap(), LibraryLoad::Current);
    let e = fence
        .set(&mut c, "lost", big(3), "{lost}:k", "w")
        .await
        .unwrap_err();
    assert_eq!(e.highest(), Some(big(4)));
    assert_eq!(c.get::<_, String>("{lost}:k").await.unwrap(), "v");
}
