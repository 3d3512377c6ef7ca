//! `palisade fence show` and `palisade fence reset`, run as a user runs them, on a real
//! database.

use std::process::Command;

use palisade_fence::{migrate, Epoch, FencingToken, Revision};
use palisade_testkit::TestDb;

fn palisade(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .env_remove("PALISADE_FENCE_DATABASE")
        .env_remove("PALISADE_AUDIT_DATABASE")
        .output()
        .expect("run palisade");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn e0(rev: u64) -> FencingToken {
    FencingToken::from_parts(Epoch::new(0).unwrap(), Revision::new(rev)).unwrap()
}

/// Raises `orders/1`'s mark to an epoch-1 token, as an example's token sent to an epoch-0
/// system does; returns that token.
async fn poison(client: &tokio_postgres::Client) -> FencingToken {
    let poison = FencingToken::from_parts(Epoch::new(1).unwrap(), Revision::new(7)).unwrap();
    client
        .execute(
            "SELECT palisade_fence.fence_raise('orders/1', $1)",
            &[&(poison.get() as i64)],
        )
        .await
        .unwrap();
    poison
}

#[tokio::test]
async fn fence_show_reads_a_poisoned_mark_and_reset_lowers_it_with_an_audited_reason() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    migrate(&mut client).await.unwrap();
    // One database for both here: the resource's marks and the audit trail.
    palisade_audit::migrate_client(&mut client).await.unwrap();
    let poison = poison(&client).await;
    let conn = db.connection_string();

    let (code, out, err) = palisade(&["fence", "--database", &conn, "show", "orders/1"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "resource orders/1");
    assert_eq!(lines[1], format!("mark {poison} (epoch 1, revision 7)"));
    assert!(lines[2].starts_with("updated 20"), "{out}");
    assert_eq!(lines.len(), 3, "no resets yet: {out}");

    let (code, _, err) = palisade(&["fence", "--database", &conn, "show", "orders/2"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("orders/2 has no mark"), "{err}");

    let to = e0(120).to_string();
    let reset = |reason: &str, to: &str| {
        palisade(&[
            "fence",
            "--database",
            &conn,
            "reset",
            "orders/1",
            "--to",
            to,
            "--reason",
            reason,
            "--audit-database",
            &conn,
            "--actor",
            "ops-alice",
        ])
    };
    let (code, _, err) = reset(" ", &to);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reason is blank"), "{err}");
    let (code, _, err) = reset("line1\nline2\u{1b}[31mRED", &to);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--reason") && err.contains("control character"),
        "{err}"
    );
    let (code, _, err) = reset(&"r".repeat(1025), &to);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--reason is 1025 bytes, more than 1024"),
        "{err}"
    );
    let (code, _, err) = reset("why", "12x");
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = reset("raise it", &(poison.get() + 1).to_string());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not below the mark"), "{err}");

    let (code, out, err) = reset("epoch-1 token from the example", &to);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("orders/1: mark reset from {poison} to {to}\n")),
        "{out}"
    );

    let row = client
        .query_one(
            "SELECT resource, old_token, new_token, reason, actor FROM fence_reset",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2),
            row.get::<_, String>(3),
            row.get::<_, String>(4),
        ),
        (
            "orders/1".to_owned(),
            poison.get() as i64,
            e0(120).get() as i64,
            "epoch-1 token from the example".to_owned(),
            "ops-alice".to_owned()
        )
    );
    let (code, out, err) = palisade(&["fence", "--database", &conn, "show", "orders/1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("mark {to} (epoch 0, revision 120)")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "by postgres: {poison} -> {to} (epoch-1 token from the example)"
        )),
        "{out}"
    );

    // Without --actor, $USER or $LOGNAME, the audit trail names the database role.
    let lower = e0(100).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "fence",
            "--database",
            &conn,
            "reset",
            "orders/1",
            "--to",
            &lower,
        ])
        .args(["--reason", "lower again", "--audit-database", &conn])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let actor: String = client
        .query_one(
            "SELECT actor FROM fence_reset WHERE reason = 'lower again'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(actor, "postgres");
}

#[tokio::test]
async fn fence_show_on_a_database_without_fence_tables_names_the_cause() {
    let db = TestDb::create().await;
    let conn = db.connection_string();
    let (code, _, err) = palisade(&["fence", "--database", &conn, "show", "orders/1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("reading the mark of orders/1")
            && err.contains("relation \"palisade_fence.fence_high_water\" does not exist")
            && err.contains("no fence tables"),
        "{err}"
    );
}

#[tokio::test]
async fn fence_show_names_a_database_that_does_not_exist_and_refuses_an_empty_resource() {
    let db = TestDb::create().await;
    let missing = format!("{}_gone", db.name());
    let conn = format!("{} dbname={missing}", db.connection_string());
    let (code, _, err) = palisade(&["fence", "--database", &conn, "show", "orders/1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("resource database: db error")
            && err.contains(&format!("database \"{missing}\" does not exist")),
        "{err}"
    );
    let (code, _, err) = palisade(&["fence", "--database", &db.connection_string(), "show", ""]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("RESOURCE is empty"), "{err}");
    // A string that is no connection string is bad input, before anything connects.
    for (garbage, says) in [
        ("garbage===", "--database is not a connection string: "),
        ("", "--database names no host"),
        ("dbname=app", "--database names no host"),
    ] {
        let (code, _, err) = palisade(&["fence", "--database", garbage, "show", "orders/1"]);
        assert_eq!(code, 2, "{garbage:?}: {err}");
        assert!(
            err.starts_with(&format!("palisade: {says}")),
            "{garbage:?}: {err}"
        );
    }
}

/// A reset whose --audit-database holds no audit trail is refused before the mark is
/// touched, and nothing is created there; `show` prints a reason that SQL stored with
/// control characters escaped, on one line.
#[tokio::test]
async fn fence_reset_refuses_an_audit_database_without_a_trail_and_show_escapes_stored_reasons() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    migrate(&mut client).await.unwrap();
    let poison = poison(&client).await;
    let conn = db.connection_string();
    let to = e0(120).to_string();
    let (code, _, err) = palisade(&[
        "fence",
        "--database",
        &conn,
        "reset",
        "orders/1",
        "--to",
        &to,
        "--reason",
        "why",
        "--audit-database",
        &conn,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--audit-database has no audit trail"), "{err}");
    let mark: i64 = client
        .query_one("SELECT token FROM palisade_fence.fence_high_water", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark, poison.get() as i64, "the mark is untouched");
    let audit_tables: Option<String> = client
        .query_one("SELECT to_regclass('audit_schema_migrations')::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(audit_tables, None, "no audit trail was created");

    // A reset made in SQL, with a reason no CLI would take.
    client
        .execute(
            "SELECT palisade_fence.fence_reset('orders/1', $1, $2)",
            &[&(e0(120).get() as i64), &"line1\nline2\u{1b}[31mRED"],
        )
        .await
        .unwrap();
    let (code, out, err) = palisade(&["fence", "--database", &conn, "show", "orders/1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 4, "{out}");
    assert!(
        out.ends_with(&format!(
            "by postgres: {poison} -> {to} (line1\\nline2\\u{{1b}}[31mRED)\n"
        )),
        "{out}"
    );
}
