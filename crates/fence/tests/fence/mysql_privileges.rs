//! The privilege model on MariaDB: a second account that holds only `EXECUTE` on
//! `fence_raise` (and its own table) raises marks through the procedure, and cannot
//! lower, overwrite or delete one by writing the mark table.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use palisade_fence::mysql::{
    fenced_transaction, read_mark, read_resets, reset_mark, FencedUpdate, MysqlFenceError,
    MysqlFenceErrorKind,
};
use palisade_fence::MysqlStore;
use palisade_fence::{HighWaterStore, Raise};

use crate::common::tok;
use crate::mysql_helper::fresh_mysql;

async fn login(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).unwrap()).await.unwrap()
}

/// The server's "command denied" (1142) for a table, or "execute denied" (1370).
fn denied(e: mysql_async::Error) -> u16 {
    match e {
        mysql_async::Error::Server(s) => s.code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[tokio::test]
async fn mysql_a_writer_with_only_execute_raises_through_the_procedure_and_cannot_touch_the_marks()
{
    let (db, mut owner) = fresh_mysql().await;
    let writer = db
        .create_user(&[
            "GRANT EXECUTE ON PROCEDURE {db}.fence_raise TO {user}",
            "GRANT SELECT, UPDATE ON {db}.accounts TO {user}",
        ])
        .await;
    let mut w = login(&writer.url).await;

    // fence_raise works for it, the body writes its own table.
    fenced_transaction(&mut w, "account/1", tok(50), |tx| {
        Box::pin(async move {
            tx.query_drop("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                .await?;
            Ok::<_, MysqlFenceError>(())
        })
    })
    .await
    .expect("EXECUTE on fence_raise is enough to raise");
    let before = read_mark(&mut owner, "account/1").await.unwrap().unwrap();
    assert_eq!(before.token, tok(50));

    // Every way of writing the mark table directly is denied.
    for sql in [
        "UPDATE fence_high_water SET token = 0",
        "DELETE FROM fence_high_water",
        "INSERT INTO fence_high_water VALUES ('account/9', 1, UTC_TIMESTAMP())",
        "REPLACE INTO fence_high_water VALUES ('account/1', 1, UTC_TIMESTAMP())",
        "INSERT INTO fence_high_water VALUES ('account/1', 1, UTC_TIMESTAMP()) \
         ON DUPLICATE KEY UPDATE token = 1",
        "TRUNCATE TABLE fence_high_water",
        "DROP TABLE fence_high_water",
        "ALTER TABLE fence_high_water MODIFY token BIGINT NULL",
        "INSERT INTO fence_reset_log (resource, old_token, new_token, reason, reset_by, reset_at) \
         VALUES ('account/1', 1, 0, 'x', 'someone', UTC_TIMESTAMP())",
        "DELETE FROM fence_reset_log",
        "SELECT token FROM fence_high_water",
    ] {
        let code = denied(w.query_drop(sql).await.unwrap_err());
        // 1142: command denied on the table; 1044: access denied to the database (DDL).
        assert!(
            matches!(code, 1142 | 1044),
            "{sql}: expected a denial, got {code}"
        );
    }
    // Nor may it replace the procedure, or run the reset.
    let code = denied(
        w.query_drop(
            "CREATE OR REPLACE PROCEDURE fence_raise(IN r VARBINARY(3072), IN t BIGINT) BEGIN END",
        )
        .await
        .unwrap_err(),
    );
    assert!(matches!(code, 1044 | 1370), "replacing fence_raise: {code}");
    let e = reset_mark(&mut w, "account/1", tok(1), "lower it")
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.code()),
        (MysqlFenceErrorKind::Database, Some(1370))
    );

    // A stale token from it is refused as from anyone.
    let e = fenced_transaction(&mut w, "account/1", tok(49), |tx| {
        Box::pin(async move {
            tx.query_drop("UPDATE accounts SET balance = 1000 WHERE id = 1")
                .await?;
            Ok::<_, MysqlFenceError>(())
        })
    })
    .await
    .unwrap_err();
    assert_eq!(e.highest(), Some(tok(50)));

    let after = read_mark(&mut owner, "account/1").await.unwrap().unwrap();
    assert_eq!(after, before, "the mark is untouched");
    let n: i64 = owner
        .query_first("SELECT COUNT(*) FROM fence_high_water")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 1);
    let balance: i64 = owner
        .query_first("SELECT balance FROM accounts WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(balance, 1);

    // The folded form needs no privilege on the fence at all: the token is in the row.
    let accounts = FencedUpdate::new("accounts", "id");
    accounts
        .execute(&mut w, 2_i64, "balance = ?", vec![7_i64.into()], tok(60))
        .await
        .unwrap();
    let e = accounts
        .execute(&mut w, 2_i64, "balance = ?", vec![8_i64.into()], tok(59))
        .await
        .unwrap_err();
    assert_eq!(e.highest(), Some(tok(60)));

    // A store that logs in as the writer raises and refuses alike.
    let store = MysqlStore::from_url(&writer.url).unwrap();
    assert_eq!(
        store.raise_async("account/1", tok(51)).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        store.raise("account/1", tok(50)).await.unwrap(),
        Raise::Stale { highest: tok(51) }
    );
    store.pool().clone().disconnect().await.unwrap();
}

#[tokio::test]
async fn mysql_a_resetter_with_only_execute_on_fence_reset_is_logged_as_itself() {
    let (db, mut owner) = fresh_mysql().await;
    owner
        .exec_drop("CALL fence_raise(?, ?)", ("account/1", tok(900).get()))
        .await
        .unwrap();
    let ops = db
        .create_user(&["GRANT EXECUTE ON PROCEDURE {db}.fence_reset TO {user}"])
        .await;
    let mut o = login(&ops.url).await;
    // It may not raise, nor write the table.
    let code = denied(
        o.exec_drop("CALL fence_raise(?, ?)", ("account/1", tok(901).get()))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 1370);
    let code = denied(
        o.query_drop("UPDATE fence_high_water SET token = 1")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 1142);
    let old = reset_mark(&mut o, "account/1", tok(10), "a mistaken epoch")
        .await
        .unwrap();
    assert_eq!(old, tok(900));
    let log = read_resets(&mut owner, "account/1", 5).await.unwrap();
    assert_eq!(log.len(), 1);
    assert!(
        log[0].reset_by.starts_with(&format!("{}@", ops.name)),
        "the log names the account that logged in, not the definer: {}",
        log[0].reset_by
    );
}
