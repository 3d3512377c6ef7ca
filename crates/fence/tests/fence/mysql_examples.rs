//! The MariaDB examples of `crates/fence/examples/mysql/`, run as they are documented: the
//! SQL through the real `mariadb` client, the Python through PyMySQL (`PALISADE_VENV_PYTHON`),
//! each as an account that holds only `EXECUTE` on `fence_raise` and rights on the
//! example's own table. Each must show the stale writer refused and its write undone.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use mysql_async::prelude::Queryable;
use palisade_fence::mysql::read_mark;
use palisade_testkit::{TestMysqlDb, TestMysqlUser};

use crate::mysql_helper::fresh_mysql;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/mysql")
        .join(name)
}

async fn writer(db: &TestMysqlDb) -> TestMysqlUser {
    db.create_user(&[
        "GRANT EXECUTE ON PROCEDURE {db}.fence_raise TO {user}",
        "GRANT CREATE, SELECT, INSERT, UPDATE ON {db}.example_account TO {user}",
    ])
    .await
}

/// The account, the example's table and the mark as the stale writer left them.
async fn assert_refused_and_undone(db: &TestMysqlDb) {
    let mut conn = db.connect().await;
    let row: (i64, i64) = conn
        .query_first("SELECT balance, last_by FROM example_account WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row, (30, 2000), "A's and B's writes, not the stale one");
    let mark = read_mark(&mut conn, "example-account/1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mark.token.get(), 2000);
}

#[tokio::test]
async fn mysql_cli_example_stops_at_the_stale_signal_and_the_write_is_rolled_back() {
    let (db, _conn) = fresh_mysql().await;
    let user = writer(&db).await;
    let (host, port) = db.host_port();
    let script = std::fs::File::open(example("stale_writer.sql")).unwrap();
    let out = Command::new("mariadb")
        .args(["-h", &host, "-P", &port.to_string(), "-u", &user.name])
        .arg(format!("-p{}", user.password))
        .arg(db.name())
        .stdin(Stdio::from(script))
        .output()
        .expect("the mariadb client runs (scripts/test installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("ERROR 1644 (45000)")
            && stderr
                .contains("fence_raise: stale token 1000, mark 2000, resource example-account/1"),
        "stderr: {stderr}"
    );
    assert_refused_and_undone(&db).await;
}

#[tokio::test]
async fn mysql_python_example_raises_stale_token_and_rolls_back() {
    let python = std::env::var("PALISADE_VENV_PYTHON").unwrap_or_else(|_| {
        panic!(
            "PALISADE_VENV_PYTHON is not set: it names a Python with PyMySQL; \
             run scripts/test, which makes one and sets it"
        )
    });
    let (db, _conn) = fresh_mysql().await;
    let user = writer(&db).await;
    let (host, port) = db.host_port();
    let out = Command::new(&python)
        .arg(example("stale_writer.py"))
        .args([
            &host,
            &port.to_string(),
            &user.name,
            &user.password,
            db.name(),
        ])
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "A (1000) wrote",
            "B (2000) wrote",
            "A (1000) refused: stale token 1000, mark 2000",
            "balance 30, last written by 2000",
        ]
    );
    assert_refused_and_undone(&db).await;
}
