//! The fence's privilege model with three roles: the owner (runs the migration, owns the
//! schema `palisade_fence`), a writer (the grants of docs/sql-api.md: EXECUTE on the
//! raise functions) and another role with CREATE on its own schema, on `public` and on the
//! database. The other role's overloads are never reached by the documented calls (from
//! psql and from psycopg, whatever integer type they send), its squats fail the migration
//! by name, and the writer can neither write the mark table nor lower a mark.

use std::process::{Command, Output};

use palisade_fence::{begin_fenced, migrate, FenceErrorKind, SCHEMA};
use palisade_testkit::TestDb;
use tokio_postgres::error::SqlState;

use crate::common::tok;
use crate::postgres_helper::mark;

/// The grants docs/sql-api.md gives a writer, with `{writer}` for its role.
pub(crate) const WRITER_GRANTS: &str = "GRANT USAGE ON SCHEMA palisade_fence TO {writer};
GRANT EXECUTE ON FUNCTION
    palisade_fence.fence_raise(text, bigint),
    palisade_fence.fence_raise_or_abort(text, bigint),
    palisade_fence.fence_raise_many(text[], bigint[]),
    palisade_fence.fence_decide(text, bigint),
    palisade_fence.fence_decide_many(text[], bigint[])
  TO {writer};";

/// Three login roles of one test database, named after it, dropped by [`Roles::drop_all`].
pub(crate) struct Roles {
    pub(crate) owner: String,
    pub(crate) writer: String,
    pub(crate) other: String,
}

impl Roles {
    /// Creates the roles: the owner may create schemas in the database (for
    /// `palisade_fence`); the other role may too, and owns a schema of its own and may
    /// create in `public` (the grant an earlier two-role setup gave).
    pub(crate) async fn create(db: &TestDb, admin: &tokio_postgres::Client) -> Roles {
        let roles = Roles {
            owner: format!("{}_owner", db.name()),
            writer: format!("{}_writer", db.name()),
            other: format!("{}_other", db.name()),
        };
        admin
            .batch_execute(&format!(
                "CREATE ROLE {owner} LOGIN; CREATE ROLE {writer} LOGIN; CREATE ROLE {other} LOGIN; \
                 GRANT CREATE ON DATABASE {db} TO {owner}, {other}; \
                 GRANT CREATE ON SCHEMA public TO {other}; \
                 CREATE SCHEMA {other} AUTHORIZATION {other}",
                owner = roles.owner,
                writer = roles.writer,
                other = roles.other,
                db = db.name()
            ))
            .await
            .unwrap();
        roles
    }

    /// A connection to the test database as `role`.
    pub(crate) async fn connect(db: &TestDb, role: &str) -> tokio_postgres::Client {
        let mut config = db.config();
        config.user(role);
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    /// The libpq connection string of the test database as `role`.
    pub(crate) fn conninfo(db: &TestDb, role: &str) -> String {
        format!("{} user={role}", db.connection_string())
    }

    /// Migrates as the owner and gives the writer the documented grants.
    pub(crate) async fn migrate_and_grant(&self, db: &TestDb) {
        let mut owner = Roles::connect(db, &self.owner).await;
        migrate(&mut owner).await.unwrap();
        owner
            .batch_execute(&WRITER_GRANTS.replace("{writer}", &self.writer))
            .await
            .unwrap();
    }

    /// Drops what the roles own in the test database, then the roles.
    pub(crate) async fn drop_all(self, admin: &tokio_postgres::Client) {
        for role in [&self.other, &self.writer, &self.owner] {
            admin
                .batch_execute(&format!("DROP OWNED BY {role} CASCADE; DROP ROLE {role}"))
                .await
                .unwrap_or_else(|e| panic!("dropping {role}: {e}"));
        }
    }
}

/// Whether the fence's mark table is missing (the migration created nothing).
async fn no_table(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT to_regclass('palisade_fence.fence_high_water') IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e} (scripts/lib/setup.sh installs it)"))
}

/// `psql -X -c sql` on `conninfo`: whether it succeeded, its stdout and its stderr.
fn psql(conninfo: &str, sql: &str) -> (bool, String, String) {
    let out = run(Command::new("psql")
        .args([
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
            "-At",
            "-d",
        ])
        .arg(conninfo)
        .arg("-c")
        .arg(sql));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The SQLSTATE of a failed statement, or the error's text when it is not a database error.
fn code(e: &tokio_postgres::Error) -> String {
    e.code()
        .map_or_else(|| e.to_string(), |c| c.code().to_owned())
}

#[tokio::test]
async fn a_writer_raises_through_the_functions_but_cannot_write_or_lower_a_mark() {
    let db = TestDb::create().await;
    let admin = db.connect().await;
    let roles = Roles::create(&db, &admin).await;
    roles.migrate_and_grant(&db).await;
    let mut writer = Roles::connect(&db, &roles.writer).await;

    begin_fenced(&mut writer, "acct/1", tok(50))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    // Every path that would change a mark or the log without the functions is refused.
    for sql in [
        "UPDATE palisade_fence.fence_high_water SET token = 1",
        "DELETE FROM palisade_fence.fence_high_water",
        "TRUNCATE palisade_fence.fence_high_water",
        "INSERT INTO palisade_fence.fence_high_water (resource, token) VALUES ('acct/2', 1)",
        "SELECT token FROM palisade_fence.fence_high_water",
        "INSERT INTO palisade_fence.fence_reset_log (resource, old_token, new_token, reason, reset_by) \
         VALUES ('acct/1', 2, 1, 'x', 'x')",
        "SELECT palisade_fence.fence_reset('acct/1', 1, 'lower it')",
        "CREATE FUNCTION palisade_fence.fence_raise(text, integer) RETURNS bigint \
         LANGUAGE sql AS 'SELECT $2::bigint'",
    ] {
        let e = writer.batch_execute(sql).await.unwrap_err();
        assert_eq!(code(&e), "42501", "{sql}: {e:?}");
    }
    // Nor can it migrate: the schema is the owner's.
    let e = migrate(&mut writer).await.unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::ForeignObject, "{e:?}");
    assert!(
        e.to_string().contains(&format!(
            "schema palisade_fence is owned by role {}, not by {}",
            roles.owner, roles.writer
        )),
        "{e}"
    );

    assert_eq!(mark(&admin, "acct/1").await, Some(tok(50)));
    let stale = begin_fenced(&mut writer, "acct/1", tok(49))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        (stale.kind(), stale.highest()),
        (FenceErrorKind::Stale, Some(tok(50)))
    );
    // PUBLIC has nothing: the other role cannot even raise.
    let other = Roles::connect(&db, &roles.other).await;
    let e = other
        .batch_execute("SELECT palisade_fence.fence_raise('acct/1', 1)")
        .await
        .unwrap_err();
    assert_eq!(code(&e), "42501", "{e:?}");
    drop((writer, other));
    roles.drop_all(&admin).await;
}

/// The other role adds overloads of the raise for integer, smallint and numeric tokens
/// that admit anything, in its own schema and in `public`, and the writer searches both
/// first. The calls as docs/sql-api.md writes them, from psql (literals) and psycopg
/// (a Python int, sent as the smallest type that fits), still reach the fence's functions
/// and refuse the stale token; the unqualified name would have reached an overload.
#[tokio::test]
async fn another_roles_overloads_are_never_reached_by_the_documented_calls() {
    let db = TestDb::create().await;
    let admin = db.connect().await;
    let roles = Roles::create(&db, &admin).await;
    roles.migrate_and_grant(&db).await;
    let other = Roles::connect(&db, &roles.other).await;
    for schema in [roles.other.as_str(), "public"] {
        for ty in ["integer", "smallint", "numeric"] {
            for f in ["fence_raise", "fence_raise_or_abort", "fence_decide"] {
                other
                    .batch_execute(&format!(
                        "CREATE FUNCTION {schema}.{f}(text, {ty}) RETURNS bigint \
                         LANGUAGE sql AS 'SELECT $2::bigint'"
                    ))
                    .await
                    .unwrap();
            }
        }
    }
    admin
        .batch_execute(&format!(
            "ALTER ROLE {w} SET search_path = {o}, public",
            w = roles.writer,
            o = roles.other
        ))
        .await
        .unwrap();
    let conninfo = Roles::conninfo(&db, &roles.writer);
    let (ok, out, err) = psql(
        &conninfo,
        "SELECT palisade_fence.fence_raise_or_abort('acct/1', 2000)",
    );
    assert!(ok, "{err}");
    assert_eq!(out, "2000\n");

    // The attack is live: the unqualified name reaches the other role's overload.
    let (ok, out, err) = psql(&conninfo, "SELECT fence_raise_or_abort('acct/1', 1000)");
    assert!(ok, "{err}");
    assert_eq!(out, "1000\n", "the overload admitted the stale token");

    for call in [
        "palisade_fence.fence_raise_or_abort('acct/1', 1000)",
        "palisade_fence.fence_raise_or_abort('acct/1', 1000::smallint)",
        "palisade_fence.fence_raise_or_abort('acct/1', 1000::integer)",
        "palisade_fence.fence_raise_or_abort('acct/1', '1000')",
    ] {
        let (ok, _, err) = psql(&conninfo, &format!("BEGIN; SELECT {call}; COMMIT"));
        assert!(!ok, "{call}");
        assert!(
            err.contains(
                "ERROR:  PF001: stale fencing token 1000 for resource acct/1: the mark is 2000"
            ),
            "{call}: {err}"
        );
    }
    for call in [
        "palisade_fence.fence_raise('acct/1', 1000)",
        "palisade_fence.fence_raise('acct/1', 1000::smallint)",
        "palisade_fence.fence_decide('acct/1', 1000::integer)",
    ] {
        let (ok, out, err) = psql(&conninfo, &format!("SELECT {call}"));
        assert!(ok, "{call}: {err}");
        assert_eq!(out, "2000\n", "{call}: the mark, not the token");
    }
    // A numeric token matches no function of the schema: the call fails, nothing admitted.
    let (ok, _, err) = psql(
        &conninfo,
        "SELECT palisade_fence.fence_raise_or_abort('acct/1', 1000.0)",
    );
    assert!(!ok);
    assert!(err.contains("42883"), "{err}");

    // psycopg sends 1000 as smallint, 70000 as integer, 2^40 as bigint: each reaches the
    // fence's bigint form.
    let script = r#"
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for token in (1000, 1999, 1 << 40, 1000):
        try:
            with conn.transaction():
                row = conn.execute("SELECT palisade_fence.fence_raise_or_abort(%s, %s)", ("acct/1", token)).fetchone()
            print(token, "admitted", row[0])
        except psycopg.Error as e:
            print(token, "refused", e.sqlstate)
    print("mark", conn.execute("SELECT palisade_fence.fence_raise(%s, %s)", ("acct/1", 70000)).fetchone()[0])
"#;
    let python = std::env::var("PALISADE_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
    let out = run(Command::new(python).args(["-c", script]).arg(&conninfo));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "1000 refused PF001\n1999 refused PF001\n{t} admitted {t}\n1000 refused PF001\nmark {t}\n",
            t = 1u64 << 40
        )
    );
    assert_eq!(mark(&admin, "acct/1").await.map(|t| t.get()), Some(1 << 40));
    drop(other);
    roles.drop_all(&admin).await;
}

/// The other role creates the fence's schema, or a fence function in `public`, before the
/// owner migrates: the migration fails and names the object, from Rust and from psql, and
/// creates nothing. A function the migration does not define inside the fence's schema
/// (even one its owner made) fails it too.
#[tokio::test]
async fn a_squatted_schema_or_function_fails_the_migration_by_name() {
    let db = TestDb::create().await;
    let admin = db.connect().await;
    let roles = Roles::create(&db, &admin).await;
    let other = Roles::connect(&db, &roles.other).await;
    let mut owner = Roles::connect(&db, &roles.owner).await;
    let migration =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/0007_fence_schema.sql");
    let psql_migrate = || {
        run(Command::new("psql")
            .args(["-X", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(Roles::conninfo(&db, &roles.owner))
            .arg("-f")
            .arg(&migration))
    };
    // 1. The schema, with a raise that admits anything.
    other
        .batch_execute(
            "CREATE SCHEMA palisade_fence; \
             CREATE FUNCTION palisade_fence.fence_raise_or_abort(text, bigint) RETURNS bigint \
             LANGUAGE sql AS 'SELECT $2'",
        )
        .await
        .unwrap();
    let e = migrate(&mut owner).await.unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::ForeignObject, "{e:?}");
    assert_eq!(e.code().map(SqlState::code), Some("PF002"));
    assert_eq!(
        e.to_string(),
        format!(
            "schema {SCHEMA} is owned by role {}, not by {}, the role running the fence migrations",
            roles.other, roles.owner
        )
    );
    let out = psql_migrate();
    assert!(!out.status.success(), "psql exited 0 on a squatted schema");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "ERROR:  schema palisade_fence is owned by role {}",
            roles.other
        )),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(no_table(&admin).await);

    // 2. A fence function where earlier versions put them.
    other
        .batch_execute(
            "DROP SCHEMA palisade_fence CASCADE; \
             CREATE FUNCTION public.fence_raise(text, bigint) RETURNS bigint \
             LANGUAGE sql AS 'SELECT $2'",
        )
        .await
        .unwrap();
    let e = migrate(&mut owner).await.unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::ForeignObject, "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "function public.fence_raise(text, bigint) is owned by role {}, not by {}, \
             the role running the fence migrations",
            roles.other, roles.owner
        )
    );
    assert!(!psql_migrate().status.success());
    assert!(no_table(&admin).await);

    // 3. Once it is gone the migration runs; then an overload inside the schema, even the
    // owner's own, or anything another role owns there, fails the next run.
    other
        .batch_execute("DROP FUNCTION public.fence_raise(text, bigint)")
        .await
        .unwrap();
    migrate(&mut owner).await.unwrap();
    let out = psql_migrate();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    owner
        .batch_execute(
            "CREATE FUNCTION palisade_fence.fence_raise_or_abort(text, integer) RETURNS bigint \
             LANGUAGE sql AS 'SELECT $2::bigint'",
        )
        .await
        .unwrap();
    let e = migrate(&mut owner).await.unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string()),
        (
            FenceErrorKind::ForeignObject,
            "function palisade_fence.fence_raise_or_abort(text, integer) was not created by \
             the fence migrations"
                .to_owned()
        )
    );
    owner
        .batch_execute("DROP FUNCTION palisade_fence.fence_raise_or_abort(text, integer)")
        .await
        .unwrap();
    admin
        .batch_execute("CREATE TABLE palisade_fence.extra (n int)")
        .await
        .unwrap();
    let e = migrate(&mut owner).await.unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string()),
        (
            FenceErrorKind::ForeignObject,
            format!(
                "table palisade_fence.extra is owned by role postgres, not by {}, the owner of \
                 schema palisade_fence: it was not created by the fence migrations",
                roles.owner
            )
        )
    );
    drop((other, owner));
    admin
        .batch_execute("DROP TABLE palisade_fence.extra")
        .await
        .unwrap();
    roles.drop_all(&admin).await;
}
