//! The SQL API from outside Rust: the fence migrations applied as plain SQL files with
//! `psql`, then the examples in `examples/sql/` run from `psql` and from Python
//! (psycopg 3), directly and behind a PgBouncer in transaction mode. Each shows a stale
//! writer refused with its transaction rolled back.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use palisade_testkit::{PgBouncer, TestDb};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Debian's python3 (where the `python3-psycopg` package installs psycopg), unless
/// `PALISADE_PYTHON` names another.
fn python() -> String {
    std::env::var("PALISADE_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_owned())
}

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e} (scripts/test installs it)"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn psql(conn: &str, file: &Path) -> Output {
    run(Command::new("psql")
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-d", conn, "-f"])
        .arg(file))
}

async fn migrated_db() -> TestDb {
    let db = TestDb::create().await;
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("crates/fence/migrations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    // The files are the migrations `palisade_fence::migrate` runs, in its order.
    let texts: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    assert_eq!(texts.join("\n"), palisade_fence::MIGRATION, "{files:?}");
    for file in &files {
        psql(&db.connection_string(), file);
    }
    db
}

#[tokio::test]
async fn the_psql_example_refuses_the_stale_writer_and_rolls_it_back() {
    let db = migrated_db().await;
    let out = psql(
        &db.connection_string(),
        &root().join("examples/sql/stale_writer.sql"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "ERROR:  PF001: stale fencing token 1000 for resource example-account/1: the mark is 2000"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("25P02: current transaction is aborted"),
        "the UPDATE after the refusal ran: {stderr}"
    );
    // A's stale transaction: BEGIN, then its COMMIT answered as ROLLBACK.
    assert!(stdout.contains("BEGIN\nROLLBACK\n"), "{stdout}");
    assert!(
        stdout.contains(" balance \n---------\n      30\n"),
        "{stdout}"
    );
    let client = db.connect().await;
    let balance: i64 = client
        .query_one("SELECT balance FROM example_account WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 30);
}

#[tokio::test]
async fn the_python_example_refuses_the_stale_writer_directly_and_behind_pgbouncer() {
    let db = migrated_db().await;
    let bouncer = PgBouncer::start().await.unwrap();
    for conn in [db.connection_string(), bouncer.connection_string(db.name())] {
        let out = run(Command::new(python())
            .arg(root().join("examples/sql/stale_writer.py"))
            .arg(&conn));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "A (token 1000): written\n\
             B (token 2000): written\n\
             A (token 1000) again: refused, the mark is 2000; rolled back\n\
             balance 30\n",
            "{conn}"
        );
    }
}
