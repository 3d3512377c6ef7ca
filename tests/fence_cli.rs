//! `palisade fence show` and `palisade fence reset`, run as a user runs them, on a real
//! database (and a real etcd for `--lock`).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{migrate, Epoch, FencingToken, PostgresStore, Raise, Revision};
use palisade_lock::{
    FileEpochStore, LockClass, LockName, Locker, LockerOptions, Mode, Namespace, Session, SpiffeId,
};
use palisade_testkit::{EtcdCluster, TestDb};

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
            "--lock-unknown",
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
        out.starts_with(&format!(
            "orders/1: mark reset from {poison} to {to} \
             (lock unknown: not checked against a lock's grants)\n"
        )),
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
            "postgres".to_owned()
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

    let lock: (Option<String>, Option<i64>) = client
        .query_one("SELECT lock_key, lock_floor FROM fence_reset", &[])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(
        lock,
        (None, None),
        "recorded as a reset with the lock unknown"
    );
    assert!(
        out.contains(&format!(
            "by postgres: {poison} -> {to} (epoch-1 token from the example) [lock unknown]"
        )),
        "{out}"
    );
}

/// The actor is the role the resource's database authenticated: neither a flag (there is
/// no --actor) nor $USER; the audit trail and fence_reset_log agree.
#[tokio::test]
async fn fence_reset_records_the_database_role_as_the_actor() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    migrate(&mut client).await.unwrap();
    palisade_audit::migrate_client(&mut client).await.unwrap();
    let poison = poison(&client).await;
    let role = format!("{}_resetter", db.name());
    client
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             GRANT USAGE ON SCHEMA palisade_fence TO {role}; \
             GRANT EXECUTE ON FUNCTION palisade_fence.fence_reset(text, bigint, text, text, bigint) TO {role};"
        ))
        .await
        .unwrap();
    let conn = db.connection_string();
    let as_role = format!("{conn} user={role}");
    let to = e0(120).to_string();
    let reset = |extra: &[&str]| {
        let mut args = vec![
            "fence",
            "--database",
            &as_role,
            "reset",
            "orders/1",
            "--to",
            &to,
            "--reason",
            "epoch-1 token",
            "--audit-database",
            &conn,
            "--lock-unknown",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(&args)
            .env("USER", "ops-alice")
            .env("LOGNAME", "ops-alice")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = reset(&["--actor", "ops-alice"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--actor"), "{err}");
    let (code, out, err) = reset(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.trim_end().ends_with(&format!(" by {role}")), "{out}");
    let audit: String = client
        .query_one("SELECT actor FROM fence_reset", &[])
        .await
        .unwrap()
        .get(0);
    let log: String = client
        .query_one("SELECT reset_by FROM palisade_fence.fence_reset_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (audit.as_str(), log.as_str()),
        (role.as_str(), role.as_str())
    );
    let mark: i64 = client
        .query_one("SELECT token FROM palisade_fence.fence_high_water", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark, e0(120).get() as i64);
    assert!(poison > e0(120));
    client
        .batch_execute(&format!(
            "REVOKE ALL ON FUNCTION palisade_fence.fence_reset(text, bigint, text, text, bigint) FROM {role}; \
             REVOKE ALL ON SCHEMA palisade_fence FROM {role}; DROP ROLE {role};"
        ))
        .await
        .unwrap();
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
        "--lock-unknown",
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
            "by postgres: {poison} -> {to} (line1\\nline2\\u{{1b}}[31mRED) [lock unknown]\n"
        )),
        "{out}"
    );
}

/// A locker on a fresh etcd with class `c` of namespace `ns`, and one session of its own.
async fn locker(cluster: &EtcdCluster, dir: &tempfile::TempDir) -> (Locker, Session) {
    let options = LockerOptions::new(cluster.endpoints());
    let locker = Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json")))
        .await
        .unwrap();
    let config = locker.config();
    config
        .put_namespace(&Namespace::new("ns", "tenant"))
        .await
        .unwrap();
    config
        .put_class(&LockClass::new("ns", "c", ""))
        .await
        .unwrap();
    let session = locker
        .open_session(
            SpiffeId::new("spiffe://test/worker").unwrap(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    (locker, session)
}

/// The probe's case: holder A is succeeded by B, a mistaken token poisons the mark, and a
/// reset to A's token (or to 0) while B holds would admit A again: refused, naming B's
/// grant. The reset to B's token goes through, A stays refused, B writes. Once B has
/// released, even B's token is refused: the lock can grant nothing below its revision.
/// Both records name the lock, its floor and the database role.
#[tokio::test]
async fn fence_reset_with_etcd_refuses_a_mark_below_the_locks_newest_grant() {
    let cluster = EtcdCluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let (locker, session) = locker(&cluster, &dir).await;
    let name = LockName::new("ns", "c", "orders/1");
    let deadline = || tokio::time::Instant::now() + Duration::from_secs(10);
    let a = locker
        .acquire(&session, &name, Mode::Exclusive, deadline())
        .await
        .unwrap();
    let ta = a.token().unwrap();
    a.release().await.unwrap();
    let b = locker
        .acquire(&session, &name, Mode::Exclusive, deadline())
        .await
        .unwrap();
    let tb = b.token().unwrap();
    assert!(tb > ta);

    let db = TestDb::create().await;
    let mut client = db.connect().await;
    migrate(&mut client).await.unwrap();
    palisade_audit::migrate_client(&mut client).await.unwrap();
    let store = PostgresStore::new(Arc::new(db.connect().await));
    assert_eq!(
        store.raise_async("orders/1", ta).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        store.raise_async("orders/1", tb).await.unwrap(),
        Raise::Admitted
    );
    let poison = poison(&client).await;
    let conn = db.connection_string();
    let endpoint = cluster.endpoints()[0].clone();
    let reset = |to: FencingToken, guard: &[&str]| {
        let to = to.to_string();
        let mut args = vec![
            "fence",
            "--database",
            &conn,
            "reset",
            "orders/1",
            "--to",
            &to,
            "--reason",
            "poisoned by a test token",
            "--audit-database",
            &conn,
        ];
        args.extend_from_slice(guard);
        palisade(&args)
    };
    let with_lock = ["--lock", "ns/c/orders/1", "--etcd", endpoint.as_str()];

    for to in [ta, FencingToken::MIN] {
        let (code, _, err) = reset(to, &with_lock);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!(
                "--to {to} is below {tb}, the newest grant of lock ns/c/orders/1 (1 holding; etcd revision"
            )),
            "{err}"
        );
    }
    // Neither the lock nor --lock-unknown: refused before anything is read.
    let (code, _, err) = reset(tb, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--lock <NAMESPACE/CLASS/KEY>") && err.contains("--lock-unknown"),
        "{err}"
    );
    let (code, _, err) = reset(tb, &["--lock", "ns/c", "--etcd", &endpoint]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("NAMESPACE/CLASS/KEY"), "{err}");
    // The actor is no longer the caller's word.
    let (code, _, err) = reset(tb, &["--lock-unknown", "--actor", "ops-alice"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(store.mark("orders/1").await.unwrap().unwrap().token, poison);

    let (code, out, err) = reset(tb, &with_lock);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!(
            "orders/1: mark reset from {poison} to {tb} (checked against lock ns/c/orders/1: not below {tb})\n"
        )),
        "{out}"
    );
    assert!(out.trim_end().ends_with(" by postgres"), "{out}");
    let fresh = PostgresStore::new(Arc::new(db.connect().await));
    assert_eq!(
        fresh.raise_async("orders/1", ta).await.unwrap(),
        Raise::Stale { highest: tb },
        "the stale holder stays refused"
    );
    assert_eq!(
        fresh.raise_async("orders/1", tb).await.unwrap(),
        Raise::Admitted
    );

    // With no holder the floor is the next grant's lowest token: even B's is refused.
    b.release().await.unwrap();
    client
        .execute(
            "SELECT palisade_fence.fence_raise('orders/1', $1)",
            &[&(poison.get() as i64)],
        )
        .await
        .unwrap();
    let (code, _, err) = reset(tb, &with_lock);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "the lowest token lock ns/c/orders/1 can grant next (no holder; etcd revision"
        ),
        "{err}"
    );

    // Without a known lock: allowed, and recorded as such.
    let (code, out, err) = reset(tb, &["--lock-unknown"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("(lock unknown: not checked against a lock's grants)"),
        "{out}"
    );

    let audit: Vec<(i64, String, Option<String>, Option<i64>)> = client
        .query(
            "SELECT new_token, actor, lock_key, lock_floor FROM fence_reset ORDER BY at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let tb64 = tb.get() as i64;
    assert_eq!(
        audit,
        [
            (
                tb64,
                "postgres".to_owned(),
                Some("ns/c/orders/1".to_owned()),
                Some(tb64)
            ),
            (tb64, "postgres".to_owned(), None, None),
        ]
    );
    let (code, out, err) = palisade(&["fence", "--database", &conn, "show", "orders/1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "-> {tb} (poisoned by a test token) [lock unknown]"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "-> {tb} (poisoned by a test token) [lock ns/c/orders/1, floor {tb}]"
        )),
        "{out}"
    );
    drop(session);
}
