//! `palisade fence show` and `fence reset` on the stores beside Postgres (`--store
//! redis://…`, `--store mysql://…`), run as a user runs them, on a real Redis and MariaDB,
//! with the audit trail in PostgreSQL.

use std::process::Command;

use palisade_fence::{Epoch, FencingToken, HighWaterStore, MarkReset, Raise, Revision};
use palisade_testkit::{TestDb, TestMysqlDb, TestRedis};

fn palisade(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .env_remove("PALISADE_FENCE_DATABASE")
        .env_remove("PALISADE_FENCE_STORE")
        .env_remove("PALISADE_AUDIT_DATABASE")
        .output()
        .expect("run palisade");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tok(epoch: u16, rev: u64) -> FencingToken {
    FencingToken::from_parts(Epoch::new(epoch).unwrap(), Revision::new(rev)).unwrap()
}

/// An audit database with its trail.
async fn audit_db() -> TestDb {
    let db = TestDb::create().await;
    palisade_audit::migrate_client(&mut db.connect().await)
        .await
        .unwrap();
    db
}

/// The same story on any store: `orders/1` poisoned with an epoch-1 token; show prints it,
/// a missing resource is exit 3, a reset that does not lower is exit 2, a reset with a
/// reason lowers it, is logged by the store and recorded in the audit trail with the
/// identity the store logged. `store` holds the flags that name the store.
async fn show_and_reset(store: &[&str], read_resets: impl AsyncFn() -> Vec<MarkReset>) {
    let audit = audit_db().await;
    let audit_conn = audit.connection_string();
    let poison = tok(1, 7);
    let run = |tail: &[&str]| {
        let mut args = vec!["fence"];
        args.extend_from_slice(store);
        args.extend_from_slice(tail);
        palisade(&args)
    };
    let (code, out, err) = run(&["show", "orders/1"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "resource orders/1");
    assert_eq!(lines[1], format!("mark {poison} (epoch 1, revision 7)"));
    assert!(lines[2].starts_with("updated 20"), "{out}");
    assert_eq!(lines.len(), 3, "no resets yet: {out}");

    let (code, _, err) = run(&["show", "orders/2"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("orders/2 has no mark"), "{err}");

    let reset = |to: &str, reason: &str| {
        run(&[
            "reset",
            "orders/1",
            "--to",
            to,
            "--reason",
            reason,
            "--audit-database",
            &audit_conn,
            "--lock-unknown",
        ])
    };
    let (code, _, err) = reset(&(poison.get() + 1).to_string(), "raise it");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not below the mark"), "{err}");
    let (code, _, err) = reset(&tok(0, 120).to_string(), "no mark");
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&[
        "reset",
        "orders/2",
        "--to",
        "1",
        "--reason",
        "nothing there",
        "--audit-database",
        &audit_conn,
        "--lock-unknown",
    ]);
    assert_eq!(code, 3, "{err}");

    let log = read_resets().await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!((log[0].old, log[0].new), (poison, tok(0, 120)));
    assert_eq!(log[0].reason, "no mark");
    let row = audit
        .connect()
        .await
        .query_one(
            "SELECT resource, old_token, new_token, actor FROM fence_reset",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, String>(3)
        ),
        (
            "orders/1".to_owned(),
            poison.get() as i64,
            tok(0, 120).get() as i64,
            log[0].reset_by.clone()
        )
    );
    let (code, out, err) = run(&["show", "orders/1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("mark {}", tok(0, 120))), "{out}");
    assert!(
        out.contains(&format!(
            "{poison} -> {} (no mark) [lock unknown]",
            tok(0, 120)
        )),
        "{out}"
    );
}

#[tokio::test]
async fn fence_show_and_reset_on_a_redis_store() {
    let redis = TestRedis::create().await;
    let layout = palisade_fence::redis::KeyLayout::new(redis.prefix()).unwrap();
    let store = palisade_fence::RedisStore::new(redis.manager().await).with_layout(layout);
    assert_eq!(
        store.raise("orders/1", tok(1, 7)).await.unwrap(),
        Raise::Admitted
    );
    let url = redis.url().to_owned();
    let flags = ["--store", &url, "--redis-prefix", redis.prefix()];
    show_and_reset(&flags, async || store.resets("orders/1", 5).await.unwrap()).await;
    // Under another prefix there is no mark.
    let (code, _, err) = palisade(&["fence", "--store", &url, "show", "orders/1"]);
    assert_eq!(code, 3, "{err}");
}

#[tokio::test]
async fn fence_show_and_reset_on_a_mariadb_store() {
    let db = TestMysqlDb::create().await;
    palisade_fence::mysql::migrate(&mut db.connect().await)
        .await
        .unwrap();
    let store = palisade_fence::MysqlStore::new(db.pool());
    assert_eq!(
        store.raise("orders/1", tok(1, 7)).await.unwrap(),
        Raise::Admitted
    );
    let url = db.url();
    show_and_reset(&["--store", &url], async || {
        store.resets("orders/1", 5).await.unwrap()
    })
    .await;
}

#[test]
fn a_store_url_is_checked_before_anything_connects() {
    for (url, cause) in [
        ("etcd://127.0.0.1:2379", "redis:// or mysql://"),
        (
            "rediss://127.0.0.1:6380",
            "name the store by its URL's scheme",
        ),
        ("127.0.0.1:6379", "name the store by its URL's scheme"),
        ("mysql://root:hunter2@127.0.0.1:3306", "names no database"),
        ("redis://[::1", "not a Redis URL"),
    ] {
        let (code, _, err) = palisade(&["fence", "--store", url, "show", "orders/1"]);
        assert_eq!(code, 2, "{url}: {err}");
        assert!(err.contains(cause), "{url}: {err}");
        assert!(
            !err.contains("hunter2"),
            "the password is not printed: {err}"
        );
    }
    let (code, _, err) = palisade(&[
        "fence",
        "--store",
        "redis://127.0.0.1:6379",
        "--redis-prefix",
        "a{b}",
        "show",
        "orders/1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--redis-prefix"), "{err}");
}
