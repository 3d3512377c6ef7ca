//! The MySQL/MariaDB fence with `autocommit=0`: a raise joins the session's implicit
//! transaction and holds the resource's lock until the caller commits or rolls back.

use mysql_async::prelude::Queryable;
use palisade_fence::mysql::{
    read_mark, read_resets, reset_mark, MysqlFenceError, MysqlFenceErrorKind,
};

use crate::mysql_helper::{fresh_mysql, raw};

/// With `autocommit=0` (the default of Python's DB drivers, JDBC's
/// `setAutoCommit(false)`) a `CALL fence_raise` that is the first statement starts the
/// session's implicit transaction and runs in it: the row lock is held until the caller's
/// `COMMIT`, so a newer writer waits for the older one and the writes commit in token
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_with_autocommit_off_the_raise_holds_the_lock_until_the_callers_commit() {
    let (db, mut setup) = fresh_mysql().await;
    setup
        .query_drop(
            "CREATE TABLE writes (id BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL) \
             ENGINE=InnoDB",
        )
        .await
        .unwrap();
    let mut older = db.connect().await;
    older.query_drop("SET autocommit = 0").await.unwrap();
    older
        .exec_drop("CALL fence_raise(?, ?)", ("acr", 5_i64))
        .await
        .unwrap();
    let in_tx: i64 = older
        .query_first("SELECT @@in_transaction")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        in_tx, 1,
        "the raise runs in the session's implicit transaction"
    );

    let mut newer = db.connect().await;
    newer.query_drop("SET autocommit = 0").await.unwrap();
    let newer = tokio::spawn(async move {
        newer
            .exec_drop("CALL fence_raise(?, ?)", ("acr", 6_i64))
            .await
            .unwrap();
        newer
            .exec_drop("INSERT INTO writes (token) VALUES (?)", (6_i64,))
            .await
            .unwrap();
        newer.query_drop("COMMIT").await.unwrap();
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert!(
        !newer.is_finished(),
        "the newer writer waits for the older one's commit"
    );
    older
        .exec_drop("INSERT INTO writes (token) VALUES (?)", (5_i64,))
        .await
        .unwrap();
    older.query_drop("COMMIT").await.unwrap();
    newer.await.unwrap();
    let tokens: Vec<i64> = setup
        .query("SELECT token FROM writes ORDER BY id")
        .await
        .unwrap();
    assert_eq!(tokens, [5, 6], "the writes commit in token order");
    assert_eq!(
        read_mark(&mut setup, "acr").await.unwrap().unwrap().token,
        raw(6)
    );

    // The stale writer, with autocommit off, waits too and is then refused.
    let mut holder = db.connect().await;
    holder.query_drop("SET autocommit = 0").await.unwrap();
    holder
        .exec_drop("CALL fence_raise(?, ?)", ("acr", 8_i64))
        .await
        .unwrap();
    let mut stale = db.connect().await;
    stale.query_drop("SET autocommit = 0").await.unwrap();
    let stale = tokio::spawn(async move {
        let e: MysqlFenceError = stale
            .exec_drop("CALL fence_raise(?, ?)", ("acr", 7_i64))
            .await
            .unwrap_err()
            .into();
        stale.query_drop("ROLLBACK").await.unwrap();
        e
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!stale.is_finished(), "the stale writer waits for the lock");
    holder.query_drop("COMMIT").await.unwrap();
    let e = stale.await.unwrap();
    assert_eq!(
        (e.kind(), e.highest()),
        (MysqlFenceErrorKind::Stale, Some(raw(8)))
    );
}

/// With `autocommit=0`, neither procedure commits: the caller's `ROLLBACK` undoes a raise
/// and a reset (its log entry included).
#[tokio::test]
async fn mysql_with_autocommit_off_a_rollback_undoes_the_raise_and_the_reset() {
    let (db, mut setup) = fresh_mysql().await;
    let mut conn = db.connect().await;
    conn.query_drop("SET autocommit = 0").await.unwrap();
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", 5_i64))
        .await
        .unwrap();
    conn.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(read_mark(&mut setup, "r").await.unwrap(), None);

    conn.exec_drop("CALL fence_raise(?, ?)", ("r", 9_i64))
        .await
        .unwrap();
    conn.query_drop("COMMIT").await.unwrap();
    assert_eq!(
        read_mark(&mut setup, "r").await.unwrap().unwrap().token,
        raw(9)
    );
    assert_eq!(
        reset_mark(&mut conn, "r", raw(2), "try").await.unwrap(),
        raw(9)
    );
    conn.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(
        read_mark(&mut setup, "r").await.unwrap().unwrap().token,
        raw(9)
    );
    assert!(read_resets(&mut setup, "r", 10).await.unwrap().is_empty());
    // The stale signal leaves the implicit transaction open: the caller rolls back.
    let e: MysqlFenceError = conn
        .exec_drop("CALL fence_raise(?, ?)", ("r", 4_i64))
        .await
        .unwrap_err()
        .into();
    assert!(e.is_stale());
    let in_tx: i64 = conn
        .query_first("SELECT @@in_transaction")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(in_tx, 1);
    conn.query_drop("ROLLBACK").await.unwrap();
}
