//! Migrations, idempotent inserts, and the indexes the dashboard relies on.

use std::time::SystemTime;

use palisade_audit::{
    insert_force_release, insert_lock_events, insert_writes, migrate, ClusterId, Finding,
    ForceRelease, LockEvent, LockEventKind, Outcome, WriteRecord,
};
use palisade_fence::{FencingToken, Revision};
use palisade_testkit::TestDb;

use crate::common::{count, migrated_db};

#[tokio::test]
async fn migrations_apply_once_even_when_two_processes_start_together() {
    let db = TestDb::create().await;
    let a = palisade_audit::pool(&db.connection_string(), 2).unwrap();
    let b = palisade_audit::pool(&db.connection_string(), 2).unwrap();
    let (ra, rb) = tokio::join!(migrate(&a), migrate(&b));
    let mut applied = [ra.unwrap(), rb.unwrap()].concat();
    applied.sort();
    assert_eq!(
        applied,
        (1..=palisade_audit::MIGRATIONS.len() as i32).collect::<Vec<_>>(),
        "exactly one of them applied each version"
    );
    assert_eq!(
        migrate(&a).await.unwrap(),
        Vec::<i32>::new(),
        "a third run applies nothing"
    );
    let client = a.get().await.unwrap();
    assert!(palisade_audit::is_current(&**client).await.unwrap());
    for table in [
        "audit_event",
        "force_release",
        "write_event",
        "audit_cursor",
        "write_event_hourly",
    ] {
        let n = count(
            &client,
            &format!("SELECT count(*) FROM information_schema.tables WHERE table_name = '{table}'"),
        )
        .await;
        assert_eq!(n, 1, "{table}");
    }
}

fn tok(rev: u64) -> FencingToken {
    FencingToken::from_u64((1 << 48) + rev).unwrap()
}

#[tokio::test]
async fn lock_events_and_force_releases_insert_idempotently() {
    let (_db, pool) = migrated_db().await;
    let client = pool.get().await.unwrap();
    let cluster = ClusterId(0xcdf8_18a3_0000_0001); // above i64::MAX: stored bit for bit
    let mut grant = LockEvent::new(
        cluster,
        Revision::new(10),
        LockEventKind::Grant,
        "/orders/42",
    );
    grant.token = Some(tok(10));
    grant.spiffe_id = Some("spiffe://td/worker-a".into());
    let mut expire1 = LockEvent::new(
        cluster,
        Revision::new(11),
        LockEventKind::Expire,
        "/orders/42",
    );
    expire1.token = Some(tok(10));
    let mut expire2 = LockEvent::new(
        cluster,
        Revision::new(11),
        LockEventKind::Expire,
        "/orders/43",
    );
    expire2.seq = 1;
    let gap = LockEvent::gap(cluster, Revision::new(12), Revision::new(40));
    let events = [grant, expire1, expire2, gap];
    assert_eq!(insert_lock_events(&**client, &events).await.unwrap(), 4);
    assert_eq!(
        insert_lock_events(&**client, &events).await.unwrap(),
        0,
        "a replay inserts nothing"
    );
    assert_eq!(count(&client, "SELECT count(*) FROM audit_event").await, 4);
    let row = client
        .query_one(
            "SELECT cluster_id, token, gap_from, gap_to FROM audit_event WHERE type = 'gap'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(ClusterId::from_sql(row.get(0)), cluster);
    assert_eq!(
        (
            row.get::<_, Option<i64>>(1),
            row.get::<_, i64>(2),
            row.get::<_, i64>(3)
        ),
        (None, 12, 40)
    );
    let t: i64 = client
        .query_one("SELECT token FROM audit_event WHERE revision = 10", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(t as u64, tok(10).get());

    let force = ForceRelease::new(
        "req-1",
        cluster,
        Revision::new(50),
        "/orders/42",
        "alice",
        "bob",
        "holder wedged",
        true,
        SystemTime::now(),
    );
    assert!(insert_force_release(&**client, &force).await.unwrap());
    assert!(
        !insert_force_release(&**client, &force).await.unwrap(),
        "same request id: skipped"
    );
    let mut selfish = force.clone();
    selfish.request_id = "req-2".into();
    selfish.approver = "alice".into();
    let err = insert_force_release(&**client, &selfish).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
        "approver must differ"
    );
    assert!(!err.is_unavailable());
}

#[tokio::test]
async fn write_rows_round_trip_and_replays_insert_nothing() {
    let (_db, pool) = migrated_db().await;
    let client = pool.get().await.unwrap();
    let at = SystemTime::now();
    let mut a = WriteRecord::new(
        "svc",
        "/r/1",
        "PUT",
        Outcome::Unprotected,
        Finding::Stale,
        at,
    );
    a.token = Some(tok(5));
    a.highest = Some(tok(9));
    a.caller = Some("spiffe://td/x".into());
    let d = WriteRecord::dropped("svc", 17);
    assert_eq!(
        insert_writes(&**client, &[a.clone(), d.clone()])
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        insert_writes(&**client, &[a.clone(), d.clone()])
            .await
            .unwrap(),
        0
    );
    let row = client
        .query_one("SELECT token, highest, finding, enforcement, caller, outcome FROM write_event WHERE id = $1", &[&a.id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0) as u64, tok(5).get());
    assert_eq!(row.get::<_, i64>(1) as u64, tok(9).get());
    assert_eq!(
        (
            row.get::<_, &str>(2),
            row.get::<_, &str>(3),
            row.get::<_, &str>(4),
            row.get::<_, &str>(5)
        ),
        ("stale", "advisory", "spiffe://td/x", "unprotected")
    );
    let n: i64 = client
        .query_one("SELECT dropped FROM write_event WHERE id = $1", &[&d.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 17);
}

/// The plans of the dashboard's queries on a table where unprotected writes are a small
/// share of 300,000 rows: each reads a partial index in `at` order, never the table.
#[tokio::test]
async fn the_unprotected_writes_queries_use_the_partial_indexes() {
    let (_db, pool) = migrated_db().await;
    let client = pool.get().await.unwrap();
    client
        .batch_execute(
            "INSERT INTO write_event (id, at, service, outcome, resource, method, finding, enforcement, namespace, class, caller) \
             SELECT gen_random_uuid(), now() - make_interval(secs => i), 'svc-' || (i % 7), \
                    CASE WHEN i % 50 = 0 THEN 'unprotected' ELSE 'admitted' END, '/r/' || (i % 1000), 'PUT', \
                    CASE WHEN i % 50 = 0 THEN 'missing_token' ELSE 'current' END, 'advisory', 'ns', 'c' || (i % 3), \
                    'spiffe://td/w' || (i % 11) \
             FROM generate_series(1, 300000) AS i; \
             ANALYZE write_event",
        )
        .await
        .unwrap();
    let plan = |sql: &'static str| {
        let client = &client;
        async move {
            let rows = client.query(&format!("EXPLAIN {sql}"), &[]).await.unwrap();
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    let newest = plan(
        "SELECT * FROM write_event WHERE outcome = 'unprotected' ORDER BY at DESC, id DESC LIMIT 51",
    )
    .await;
    assert!(newest.contains("write_event_unprotected_at"), "{newest}");
    assert!(!newest.contains("Seq Scan"), "{newest}");
    let page = plan(
        "SELECT * FROM write_event WHERE outcome = 'unprotected' AND (at, id) < (now() - interval '1 hour', \
         '00000000-0000-0000-0000-000000000000') ORDER BY at DESC, id DESC LIMIT 51",
    )
    .await;
    assert!(page.contains("write_event_unprotected_at"), "{page}");
    let by_resource = plan(
        "SELECT * FROM write_event WHERE outcome = 'unprotected' AND resource = '/r/500' ORDER BY at DESC, id DESC LIMIT 51",
    )
    .await;
    assert!(
        by_resource.contains("write_event_unprotected_resource"),
        "{by_resource}"
    );
    let by_caller = plan(
        "SELECT * FROM write_event WHERE outcome = 'unprotected' AND caller = 'spiffe://td/w0' ORDER BY at DESC, id DESC LIMIT 51",
    )
    .await;
    assert!(
        by_caller.contains("write_event_unprotected_caller"),
        "{by_caller}"
    );
}

/// Rows of `write_event_hourly` that differ from counting `write_event` (either way).
async fn hourly_disagreements(client: &tokio_postgres::Client) -> i64 {
    count(
        client,
        "WITH counted AS ( \
            SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, namespace, class, service, \
                   caller, finding, count(*) AS n \
            FROM write_event WHERE outcome = 'unprotected' GROUP BY 1, 2, 3, 4, 5, 6), \
         kept AS (SELECT hour, namespace, class, service, caller, finding, n FROM write_event_hourly) \
         SELECT count(*) FROM ((SELECT * FROM counted EXCEPT ALL SELECT * FROM kept) \
                               UNION ALL (SELECT * FROM kept EXCEPT ALL SELECT * FROM counted)) d",
    )
    .await
}

/// `(service, caller, n)` of each hourly counter, by hour.
async fn kept(client: &tokio_postgres::Client) -> Vec<(String, Option<String>, i64)> {
    client
        .query(
            "SELECT service, caller, n FROM write_event_hourly ORDER BY hour, service, caller",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn unprotected_at(at: SystemTime, service: &str, caller: Option<&str>) -> WriteRecord {
    let mut r = WriteRecord::new(
        service,
        "/r/1",
        "PUT",
        Outcome::Unprotected,
        Finding::MissingToken,
        at,
    );
    r.caller = caller.map(str::to_owned);
    r
}

/// Migration 3 back-fills the hourly counts from the rows already stored, and from then
/// on every insert (replays too), update, delete and truncate keeps them equal to the rows.
#[tokio::test]
async fn hourly_counts_are_back_filled_and_kept_with_the_rows() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    // The schema as it was before version 3, with rows in it.
    for (version, name, sql) in &palisade_audit::MIGRATIONS[..2] {
        client.batch_execute(sql).await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS audit_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, \
                 applied_at timestamptz NOT NULL DEFAULT now()); \
                 INSERT INTO audit_schema_migrations (version, name) VALUES ({version}, '{name}')"
            ))
            .await
            .unwrap();
    }
    let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 / 3600 * 3600);
    let min = |m: u64| t0 + std::time::Duration::from_secs(60 * m);
    let old = vec![
        unprotected_at(min(1), "a", None),
        unprotected_at(min(2), "a", None),
        unprotected_at(min(3), "a", Some("spiffe://td/x")),
        unprotected_at(min(61), "b", None),
        WriteRecord::new(
            "a",
            "/r/1",
            "PUT",
            Outcome::Admitted,
            Finding::Current,
            min(4),
        ),
        WriteRecord::dropped("a", 5),
    ];
    insert_writes(&client, &old).await.unwrap();
    assert_eq!(
        palisade_audit::migrate_client(&mut client).await.unwrap(),
        (3..=palisade_audit::MIGRATIONS.len() as i32).collect::<Vec<_>>()
    );
    assert_eq!(
        kept(&client).await,
        [
            ("a".to_owned(), Some("spiffe://td/x".to_owned()), 1),
            ("a".to_owned(), None, 2),
            ("b".to_owned(), None, 1)
        ]
    );
    assert_eq!(hourly_disagreements(&client).await, 0);

    // New rows, and a replay of old ones that inserts nothing.
    let new = vec![
        unprotected_at(min(5), "a", None),
        unprotected_at(min(125), "c", None),
    ];
    assert_eq!(
        insert_writes(&client, &[new.clone(), old.clone()].concat())
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        count(
            &client,
            "SELECT n FROM write_event_hourly WHERE service = 'a' AND caller IS NULL"
        )
        .await,
        3
    );
    assert_eq!(hourly_disagreements(&client).await, 0);
    // A rolled-back insert leaves no count behind.
    client.batch_execute("BEGIN").await.unwrap();
    insert_writes(&client, &[unprotected_at(min(6), "a", None)])
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(hourly_disagreements(&client).await, 0);
    assert_eq!(
        count(&client, "SELECT sum(n)::bigint FROM write_event_hourly").await,
        6
    );
    // Updates and deletes move and remove counts; an emptied counter is gone.
    client
        .batch_execute("UPDATE write_event SET service = 'z' WHERE service = 'b'")
        .await
        .unwrap();
    assert_eq!(hourly_disagreements(&client).await, 0);
    client
        .batch_execute("DELETE FROM write_event WHERE service = 'c' OR caller IS NOT NULL")
        .await
        .unwrap();
    assert_eq!(hourly_disagreements(&client).await, 0);
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM write_event_hourly WHERE service IN ('b', 'c')"
        )
        .await,
        0
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM write_event_hourly").await,
        2
    );
    client.batch_execute("TRUNCATE write_event").await.unwrap();
    assert_eq!(
        count(&client, "SELECT count(*) FROM write_event_hourly").await,
        0
    );
}
