//! The MySQL/MariaDB helper on a real MariaDB: the raise, the transaction forms, the
//! folded update, resets and their log. A fresh database per test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel, TxOpts};
use palisade_fence::mysql::{
    begin_fenced, fenced_transaction, migrate, read_mark, read_resets, reset_mark,
    reset_mark_guarded, FencedUpdate, MysqlFenceError, MysqlFenceErrorKind, ResetGuard, MIGRATION,
};
use palisade_fence::FencingToken;
use palisade_testkit::TestMysqlDb;

use crate::common::tok;

/// A fresh database with the fence migrated (twice: it is idempotent) and a table
/// `accounts (id, balance, note)` with rows 1 and 2.
pub(crate) async fn fresh_mysql() -> (TestMysqlDb, Conn) {
    let db = TestMysqlDb::create().await;
    let mut conn = db.connect().await;
    migrate(&mut conn).await.unwrap();
    migrate(&mut conn).await.unwrap();
    conn.query_drop(
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, \
         note VARCHAR(64) NOT NULL DEFAULT '', fence_token BIGINT NULL) ENGINE=InnoDB; \
         INSERT INTO accounts (id, balance) VALUES (1, 0), (2, 0)",
    )
    .await
    .unwrap();
    (db, conn)
}

pub(crate) fn opts(level: IsolationLevel) -> TxOpts {
    let mut o = TxOpts::default();
    o.with_isolation_level(level);
    o
}

async fn balance(conn: &mut Conn, id: i64) -> i64 {
    conn.exec_first("SELECT balance FROM accounts WHERE id = ?", (id,))
        .await
        .unwrap()
        .unwrap()
}

/// One fenced write: `balance = balance + 1` on account 1 under `token`.
async fn credit(conn: &mut Conn, token: FencingToken) -> Result<(), MysqlFenceError> {
    fenced_transaction(conn, "account/1", token, |tx| {
        Box::pin(async move {
            tx.query_drop("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                .await?;
            Ok::<_, MysqlFenceError>(())
        })
    })
    .await
}

#[tokio::test]
async fn mysql_first_raise_equal_and_newer_are_admitted_and_a_stale_one_writes_nothing() {
    let (_db, mut conn) = fresh_mysql().await;
    assert_eq!(read_mark(&mut conn, "account/1").await.unwrap(), None);
    credit(&mut conn, tok(10))
        .await
        .expect("a resource's first raise is admitted");
    credit(&mut conn, tok(10))
        .await
        .expect("an equal token is admitted");
    assert_eq!(balance(&mut conn, 1).await, 2);
    let mark = read_mark(&mut conn, "account/1").await.unwrap().unwrap();
    assert_eq!(mark.token, tok(10));

    let ran = Arc::new(AtomicBool::new(false));
    let ran2 = Arc::clone(&ran);
    let err = fenced_transaction(&mut conn, "account/1", tok(9), move |tx| {
        Box::pin(async move {
            ran2.store(true, Ordering::SeqCst);
            tx.query_drop("UPDATE accounts SET balance = 100 WHERE id = 1")
                .await?;
            Ok::<_, MysqlFenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert_eq!(err.kind(), MysqlFenceErrorKind::Stale);
    assert!(err.is_stale() && !err.is_retryable());
    assert_eq!((err.token(), err.highest()), (Some(tok(9)), Some(tok(10))));
    assert_eq!((err.code(), err.sql_state()), (Some(1644), Some("45000")));
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body of a stale writer never runs"
    );
    assert_eq!(balance(&mut conn, 1).await, 2, "nothing written");
    let after = read_mark(&mut conn, "account/1").await.unwrap().unwrap();
    assert_eq!(
        after, mark,
        "the mark row is unchanged, updated_at included"
    );

    credit(&mut conn, tok(11)).await.unwrap();
    assert_eq!(balance(&mut conn, 1).await, 3);
    let newer = read_mark(&mut conn, "account/1").await.unwrap().unwrap();
    assert_eq!(newer.token, tok(11));
    assert!(newer.updated_at >= mark.updated_at);
}

/// A stale raise made by hand, after a write in the same transaction: the error leaves
/// the transaction open (MariaDB), the helper's rule is to roll back, and then the row
/// and the mark are as they were.
#[tokio::test]
async fn mysql_a_stale_raise_inside_a_transaction_leaves_it_open_and_rollback_undoes_the_write() {
    let (_db, mut conn) = fresh_mysql().await;
    conn.exec_drop("CALL fence_raise(?, ?)", ("account/2", tok(7).get()))
        .await
        .unwrap();
    conn.query_drop("START TRANSACTION").await.unwrap();
    conn.query_drop("UPDATE accounts SET balance = 50 WHERE id = 2")
        .await
        .unwrap();
    let err: MysqlFenceError = conn
        .exec_drop("CALL fence_raise(?, ?)", ("account/2", tok(6).get()))
        .await
        .unwrap_err()
        .into();
    assert_eq!((err.token(), err.highest()), (Some(tok(6)), Some(tok(7))));
    let open: i64 = conn
        .query_first("SELECT @@in_transaction")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(open, 1, "MariaDB does not end a transaction on an error");
    conn.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(balance(&mut conn, 2).await, 0);
    assert_eq!(
        read_mark(&mut conn, "account/2")
            .await
            .unwrap()
            .unwrap()
            .token,
        tok(7)
    );
    // In autocommit mode the procedure is a transaction of its own.
    let err: MysqlFenceError = conn
        .exec_drop("CALL fence_raise(?, ?)", ("account/2", tok(1).get()))
        .await
        .unwrap_err()
        .into();
    assert!(err.is_stale());
    let open: i64 = conn
        .query_first("SELECT @@in_transaction")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(open, 0);
}

/// The same rules at both isolation levels, with a writer that read its data before a
/// newer writer committed: the raise waits for the newer writer's lock and refuses, and
/// an admitted writer's first plain read (after the raise) sees the previous commit.
#[tokio::test]
async fn mysql_repeatable_read_and_read_committed_both_refuse_and_see_the_latest_commit() {
    for level in [
        IsolationLevel::RepeatableRead,
        IsolationLevel::ReadCommitted,
    ] {
        let (db, mut setup) = fresh_mysql().await;
        credit(&mut setup, tok(5)).await.unwrap();
        let mut a = db.connect().await;
        let mut b = db.connect().await;
        // B (token 6) raises and holds the lock, uncommitted.
        let mut tx_b = begin_fenced(&mut b, opts(level), "account/1", tok(6))
            .await
            .unwrap();
        tx_b.query_drop("UPDATE accounts SET balance = balance + 10 WHERE id = 1")
            .await
            .unwrap();
        // A (token 5, equal to the committed mark) must wait for B, then be refused.
        let a_task = tokio::spawn(async move {
            let r = begin_fenced(&mut a, opts(level), "account/1", tok(5))
                .await
                .map(|_| ());
            (r, a)
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!a_task.is_finished(), "{level:?}: A waits for B's lock");
        tx_b.commit().await.unwrap();
        let (r, _a) = a_task.await.unwrap();
        let err = r.unwrap_err();
        assert_eq!(
            (err.kind(), err.highest()),
            (MysqlFenceErrorKind::Stale, Some(tok(6))),
            "{level:?}"
        );
        // C (token 7) begins its transaction, raises, then reads: it sees B's write.
        let mut c = db.connect().await;
        let mut tx_c = begin_fenced(&mut c, opts(level), "account/1", tok(7))
            .await
            .unwrap();
        let seen: i64 = tx_c
            .query_first("SELECT balance FROM accounts WHERE id = 1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen, 11, "{level:?}");
        tx_c.rollback().await.unwrap();
        assert_eq!(
            read_mark(&mut setup, "account/1")
                .await
                .unwrap()
                .unwrap()
                .token,
            tok(6),
            "{level:?}: C's raise rolled back with C"
        );
    }
}

#[tokio::test]
async fn mysql_a_failing_body_rolls_back_its_writes_and_the_raise() {
    let (_db, mut conn) = fresh_mysql().await;
    let err = fenced_transaction(&mut conn, "account/1", tok(3), |tx| {
        Box::pin(async move {
            tx.query_drop("UPDATE accounts SET balance = 7 WHERE id = 1")
                .await?;
            tx.query_drop("UPDATE no_such_table SET x = 1").await?;
            Ok::<_, MysqlFenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert_eq!(
        (err.kind(), err.code()),
        (MysqlFenceErrorKind::Database, Some(1146))
    );
    assert_eq!(balance(&mut conn, 1).await, 0);
    assert_eq!(read_mark(&mut conn, "account/1").await.unwrap(), None);
}

#[tokio::test]
async fn mysql_folded_update_admits_equal_and_newer_and_refuses_older_without_writing() {
    let (db, mut conn) = fresh_mysql().await;
    let accounts = FencedUpdate::new("accounts", "id");
    let set = "balance = balance + ?, note = ?";
    let n = accounts
        .execute(
            &mut conn,
            1_i64,
            set,
            vec![5_i64.into(), "a".into()],
            tok(20),
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "a NULL token column admits any token");
    let err = accounts
        .execute(
            &mut conn,
            1_i64,
            set,
            vec![1_i64.into(), "b".into()],
            tok(19),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind(), err.highest()),
        (MysqlFenceErrorKind::Stale, Some(tok(20)))
    );
    let row: (i64, String, i64) = conn
        .query_first("SELECT balance, note, fence_token FROM accounts WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row, (5, "a".to_owned(), tok(20).get() as i64));
    // Equal token, values as they were: MySQL changes no row, the helper reports a match.
    let n = accounts
        .execute(&mut conn, 1_i64, "note = ?", vec!["a".into()], tok(20))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let n = accounts
        .execute(
            &mut conn,
            1_i64,
            set,
            vec![1_i64.into(), "c".into()],
            tok(21),
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(balance(&mut conn, 1).await, 6);
    let err = accounts
        .execute(
            &mut conn,
            99_i64,
            set,
            vec![1_i64.into(), "x".into()],
            tok(30),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), MysqlFenceErrorKind::RowMissing);
    // Inside a transaction at REPEATABLE READ: the probe reads the latest row, not the
    // snapshot.
    let mut other = db.connect().await;
    let mut tx = other
        .start_transaction(opts(IsolationLevel::RepeatableRead))
        .await
        .unwrap();
    let _: Option<i64> = tx
        .query_first("SELECT balance FROM accounts WHERE id = 1")
        .await
        .unwrap();
    accounts
        .execute(
            &mut conn,
            1_i64,
            set,
            vec![0_i64.into(), "d".into()],
            tok(25),
        )
        .await
        .unwrap();
    let err = accounts
        .execute(&mut tx, 1_i64, set, vec![0_i64.into(), "e".into()], tok(22))
        .await
        .unwrap_err();
    assert_eq!(err.highest(), Some(tok(25)));
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn mysql_resets_only_lower_need_a_reason_respect_the_floor_and_are_logged() {
    let (_db, mut conn) = fresh_mysql().await;
    let e = reset_mark(&mut conn, "r", tok(1), "x").await.unwrap_err();
    assert_eq!(
        (e.kind(), e.sql_state()),
        (MysqlFenceErrorKind::NoMark, Some("P0002"))
    );
    assert!(e.to_string().contains("r has no mark"), "{e}");
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", tok(100).get()))
        .await
        .unwrap();
    for (to, reason, guard, says) in [
        (
            tok(50),
            "  ",
            ResetGuard::LockUnknown,
            "a reason is required",
        ),
        (
            tok(100),
            "same",
            ResetGuard::LockUnknown,
            "is not below the mark",
        ),
        (
            tok(200),
            "up",
            ResetGuard::LockUnknown,
            "is not below the mark",
        ),
        (
            tok(40),
            "below floor",
            ResetGuard::lock("ns/c/k", tok(60)),
            "is below",
        ),
    ] {
        let e = reset_mark_guarded(&mut conn, "r", to, reason, &guard)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), MysqlFenceErrorKind::BadReset, "{reason}: {e}");
        assert!(e.to_string().contains(says), "{reason}: {e}");
    }
    assert_eq!(
        read_mark(&mut conn, "r").await.unwrap().unwrap().token,
        tok(100)
    );
    assert!(read_resets(&mut conn, "r", 10).await.unwrap().is_empty());

    let old = reset_mark_guarded(
        &mut conn,
        "r",
        tok(60),
        "epoch-1 token by mistake",
        &ResetGuard::lock("ns/c/k", tok(60)),
    )
    .await
    .unwrap();
    assert_eq!(old, tok(100));
    let old = reset_mark(&mut conn, "r", tok(55), "second").await.unwrap();
    assert_eq!(old, tok(60));
    assert_eq!(
        read_mark(&mut conn, "r").await.unwrap().unwrap().token,
        tok(55)
    );
    // A token between the new mark and the old one is admitted again.
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", tok(58).get()))
        .await
        .unwrap();
    let log = read_resets(&mut conn, "r", 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].old, log[0].new, log[0].reason.as_str()),
        (tok(60), tok(55), "second")
    );
    assert_eq!(log[0].lock, None);
    assert_eq!(
        (log[1].old, log[1].new, log[1].lock.clone()),
        (tok(100), tok(60), Some(("ns/c/k".to_owned(), tok(60))))
    );
    assert!(log[0].reset_by.starts_with("root@"), "{}", log[0].reset_by);
    assert!(log[0].reset_at >= log[1].reset_at);
    assert_eq!(read_resets(&mut conn, "r", 1).await.unwrap().len(), 1);
    assert!(read_resets(&mut conn, "other", 10)
        .await
        .unwrap()
        .is_empty());
}

/// The reset inside a caller's transaction commits or rolls back with it, log included.
#[tokio::test]
async fn mysql_a_reset_inside_a_rolled_back_transaction_leaves_no_mark_change_and_no_log() {
    let (_db, mut conn) = fresh_mysql().await;
    conn.exec_drop("CALL fence_raise(?, ?)", ("r", tok(9).get()))
        .await
        .unwrap();
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    assert_eq!(
        reset_mark(&mut tx, "r", tok(2), "try").await.unwrap(),
        tok(9)
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        read_mark(&mut conn, "r").await.unwrap().unwrap().token,
        tok(9)
    );
    assert!(read_resets(&mut conn, "r", 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn mysql_the_migration_runs_from_the_cli_too_and_names_and_bytes_are_exact() {
    let (db, mut conn) = fresh_mysql().await;
    // The SQL file as the mariadb client runs it (DELIMITER lines), on top of migrate.
    let (host, port) = db.host_port();
    let mut child = std::process::Command::new("mariadb")
        .args([
            "-h",
            &host,
            "-P",
            &port.to_string(),
            "-u",
            "root",
            db.name(),
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("the mariadb client runs (scripts/test installs it)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(MIGRATION.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    // Names differ by case, a trailing space, a NUL: separate marks (VARBINARY key).
    for (i, name) in ["Orders/1", "orders/1", "orders/1 ", "orders/\0x"]
        .iter()
        .enumerate()
    {
        conn.exec_drop(
            "CALL fence_raise(?, ?)",
            (name.as_bytes(), tok(10 + i as u64).get()),
        )
        .await
        .unwrap();
    }
    for (i, name) in ["Orders/1", "orders/1", "orders/1 ", "orders/\0x"]
        .iter()
        .enumerate()
    {
        let m = read_mark(&mut conn, name).await.unwrap().unwrap();
        assert_eq!(m.token, tok(10 + i as u64), "{name:?}");
    }
    // A NULL or negative argument is refused before any mark is touched.
    let e: MysqlFenceError = conn
        .exec_drop("CALL fence_raise(?, ?)", ("x", None::<i64>))
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.kind(), MysqlFenceErrorKind::BadArgument);
    let e: MysqlFenceError = conn
        .exec_drop("CALL fence_raise(?, ?)", ("x", -1_i64))
        .await
        .unwrap_err()
        .into();
    assert_eq!(
        (e.kind(), e.sql_state()),
        (MysqlFenceErrorKind::BadArgument, Some("22003"))
    );
    assert_eq!(read_mark(&mut conn, "x").await.unwrap(), None);
}

/// A token as a plain integer, as the SQL in these tests writes it.
pub(crate) fn raw(n: i64) -> FencingToken {
    FencingToken::try_from(n).unwrap()
}
