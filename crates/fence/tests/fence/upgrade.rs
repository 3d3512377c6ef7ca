//! A database of an earlier version (tables and functions in `public`, made by the SQL in
//! `legacy/`, which those versions applied) brought up to date by `migrate`: its marks and
//! resets moved into the schema `palisade_fence`, its functions replaced there, its
//! writers granted the raise functions instead of the table.

use palisade_fence::{begin_fenced, migrate, FenceErrorKind, MIGRATION};
use palisade_testkit::TestDb;
use tokio_postgres::error::SqlState;

use crate::common::tok;
use crate::mark_locks::mark_writer;
use crate::postgres_helper::mark;

/// The SQL earlier versions applied, in order.
const LEGACY: [&str; 6] = [
    include_str!("legacy/0001_fence_high_water.sql"),
    include_str!("legacy/0002_fence_raise.sql"),
    include_str!("legacy/0003_fence_raise_many.sql"),
    include_str!("legacy/0004_fence_reset.sql"),
    include_str!("legacy/0005_fence_raise_by_schema.sql"),
    include_str!("legacy/0006_fence_decide.sql"),
];

/// A database created by the first migration alone, with marks in it: the raise fails as
/// an undefined function until `migrate` runs, then works on the existing marks.
#[tokio::test]
async fn migrate_brings_a_database_of_the_first_migration_up_to_date() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    client.batch_execute(LEGACY[0]).await.unwrap();
    client
        .execute(
            "INSERT INTO fence_high_water (resource, token) VALUES ('r', $1)",
            &[&tok(10)],
        )
        .await
        .unwrap();
    let err = begin_fenced(&mut client, "r", tok(10))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INVALID_SCHEMA_NAME), "{err:?}");

    assert!(MIGRATION.contains("CREATE TABLE IF NOT EXISTS palisade_fence.fence_high_water"));
    migrate(&mut client).await.unwrap();
    migrate(&mut client).await.unwrap();
    assert_eq!(
        mark(&client, "r").await,
        Some(tok(10)),
        "migrate kept the marks"
    );
    let writer = mark_writer(&client, "r").await;
    begin_fenced(&mut client, "r", tok(10))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    assert_eq!(mark_writer(&client, "r").await, writer);
    let stale = begin_fenced(&mut client, "r", tok(9))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(10)))
    );
    begin_fenced(&mut client, "r", tok(12))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    assert_eq!(mark(&client, "r").await, Some(tok(12)));
}

/// A database of the schema's first version, whose `fence_reset(text, bigint, text)` took
/// no lock: `migrate` drops it (a call to it lowered a mark unchecked) and grants the
/// current one to every role that could run it; a lock's floor is then enforced.
#[tokio::test]
async fn migrate_replaces_the_three_argument_reset_and_keeps_its_resetters() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    migrate(&mut client).await.unwrap();
    let role = format!("{}_old_resetter", db.name());
    // The first version's signature, as that version left it: owned by the fence's owner,
    // granted to a resetter.
    client
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
             CREATE FUNCTION palisade_fence.fence_reset(p_resource text, p_to bigint, p_reason text) \
             RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp \
             AS 'SELECT 0::bigint'; \
             GRANT EXECUTE ON FUNCTION palisade_fence.fence_reset(text, bigint, text) TO {role};"
        ))
        .await
        .unwrap();
    migrate(&mut client).await.unwrap();
    let resets: Vec<String> = client
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p \
             WHERE p.pronamespace = 'palisade_fence'::regnamespace AND p.proname = 'fence_reset'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        resets,
        ["palisade_fence.fence_reset(text,bigint,text,text,bigint)"]
    );
    let may: bool = client
        .query_one(
            "SELECT has_function_privilege($1, \
             'palisade_fence.fence_reset(text, bigint, text, text, bigint)', 'EXECUTE')",
            &[&role],
        )
        .await
        .unwrap()
        .get(0);
    assert!(may, "the resetter keeps its right to reset");

    client
        .execute("SELECT palisade_fence.fence_raise('r', $1)", &[&tok(90)])
        .await
        .unwrap();
    let below = client
        .query_one(
            "SELECT palisade_fence.fence_reset('r', $1, 'poisoned', 'ns/c/k', $2)",
            &[&tok(40), &tok(50)],
        )
        .await
        .unwrap_err();
    assert_eq!(
        below.code(),
        Some(&SqlState::INVALID_PARAMETER_VALUE),
        "{below:?}"
    );
    assert_eq!(
        mark(&client, "r").await,
        Some(tok(90)),
        "refused: unchanged"
    );
    let half = client
        .query_one(
            "SELECT palisade_fence.fence_reset('r', $1, 'poisoned', 'ns/c/k', NULL)",
            &[&tok(50)],
        )
        .await
        .unwrap_err();
    assert_eq!(
        half.code(),
        Some(&SqlState::INVALID_PARAMETER_VALUE),
        "{half:?}"
    );
    client
        .query_one(
            "SELECT palisade_fence.fence_reset('r', $1, 'poisoned', 'ns/c/k', $1)",
            &[&tok(50)],
        )
        .await
        .unwrap();
    client
        .query_one(
            "SELECT palisade_fence.fence_reset('r', $1, 'unknown')",
            &[&tok(20)],
        )
        .await
        .unwrap();
    let log: Vec<(i64, Option<String>, Option<i64>)> = client
        .query(
            "SELECT new_token, lock_key, lock_floor FROM palisade_fence.fence_reset_log ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let t = |r| tok(r).get() as i64;
    assert_eq!(
        log,
        [
            (t(50), Some("ns/c/k".to_owned()), Some(t(50))),
            (t(20), None, None)
        ]
    );
    client
        .batch_execute(&format!(
            "REVOKE ALL ON FUNCTION palisade_fence.fence_reset(text, bigint, text, text, bigint) FROM {role}; \
             DROP ROLE {role};"
        ))
        .await
        .unwrap();
}

/// The fence's objects left in `schema`: `kind name` rows, sorted.
async fn fence_objects(client: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    client
        .query(
            "SELECT 'table ' || c.relname::text FROM pg_class c \
               WHERE c.relnamespace = $1::text::regnamespace AND c.relkind = 'r' \
             UNION ALL \
             SELECT 'function ' || p.proname::text || '(' || oidvectortypes(p.proargtypes) || ')' \
               FROM pg_proc p WHERE p.pronamespace = $1::text::regnamespace \
             ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A database of migrations 0001 to 0006, with a mark, a reset and a role that wrote the
/// mark table directly: `migrate` moves the rows into `palisade_fence`, leaves nothing of
/// the fence in `public`, makes every function `SECURITY DEFINER` with its search_path
/// pinned, and turns the role's table privileges into EXECUTE on the raise functions.
#[tokio::test]
async fn migrate_moves_a_database_of_migrations_0001_to_0006_into_the_fence_schema() {
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    for sql in LEGACY {
        client.batch_execute(sql).await.unwrap();
    }
    let writer = format!("{}_writer", db.name());
    client
        .batch_execute(&format!(
            "CREATE ROLE {writer} LOGIN; \
             GRANT SELECT, INSERT, UPDATE ON fence_high_water TO {writer}; \
             SELECT fence_raise('r', {}); SELECT fence_reset('r', {}, 'poisoned')",
            tok(9).get(),
            tok(5).get()
        ))
        .await
        .unwrap();
    assert_eq!(fence_objects(&client, "public").await.len(), 8);

    migrate(&mut client).await.unwrap();
    migrate(&mut client).await.unwrap();
    assert_eq!(
        fence_objects(&client, "public").await,
        Vec::<String>::new(),
        "nothing of the fence is left in public"
    );
    assert_eq!(
        fence_objects(&client, "palisade_fence").await,
        [
            "function fence_decide(text, bigint)",
            "function fence_decide_many(text[], bigint[])",
            "function fence_raise(text, bigint)",
            "function fence_raise_many(text[], bigint[])",
            "function fence_raise_or_abort(text, bigint)",
            "function fence_reset(text, bigint, text, text, bigint)",
            "table fence_high_water",
            "table fence_reset_log",
        ]
    );
    let configs: Vec<(bool, Option<Vec<String>>)> = client
        .query(
            "SELECT prosecdef, proconfig FROM pg_proc \
             WHERE pronamespace = 'palisade_fence'::regnamespace",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(configs.len(), 6);
    for c in configs {
        assert_eq!(
            c,
            (
                true,
                Some(vec!["search_path=pg_catalog, pg_temp".to_owned()])
            )
        );
    }
    assert_eq!(mark(&client, "r").await, Some(tok(5)), "the mark moved");
    let log: (String, i64, i64, String) = client
        .query_one(
            "SELECT resource, old_token, new_token, reason FROM palisade_fence.fence_reset_log",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .unwrap();
    assert_eq!(
        log,
        (
            "r".to_owned(),
            tok(9).get() as i64,
            tok(5).get() as i64,
            "poisoned".to_owned()
        )
    );
    // The role that wrote the table keeps SELECT and may raise, but no longer write it.
    let privileges: Vec<bool> = client
        .query_one(
            "SELECT has_table_privilege($1, 'palisade_fence.fence_high_water', 'SELECT'), \
                    has_table_privilege($1, 'palisade_fence.fence_high_water', 'UPDATE'), \
                    has_table_privilege($1, 'palisade_fence.fence_high_water', 'INSERT'), \
                    has_function_privilege($1, 'palisade_fence.fence_raise_or_abort(text, bigint)', 'EXECUTE'), \
                    has_function_privilege($1, 'palisade_fence.fence_decide_many(text[], bigint[])', 'EXECUTE'), \
                    has_function_privilege($1, 'palisade_fence.fence_reset(text, bigint, text, text, bigint)', 'EXECUTE')",
            &[&writer],
        )
        .await
        .map(|r| (0..6).map(|i| r.get(i)).collect())
        .unwrap();
    assert_eq!(privileges, [true, false, false, true, true, false]);

    let stale = begin_fenced(&mut client, "r", tok(4))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(5)))
    );
    client
        .batch_execute(&format!("DROP OWNED BY {writer}; DROP ROLE {writer}"))
        .await
        .unwrap();
}
