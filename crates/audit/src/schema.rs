//! The audit schema: migrations shipped with the crate, applied at start.

use deadpool_postgres::Pool;
use tokio_postgres::GenericClient;

use crate::AuditError;

/// The migrations, in order: `(version, name, SQL)`. Each runs once, in its own
/// transaction, recorded in `audit_schema_migrations`.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "audit", include_str!("../migrations/0001_audit.sql")),
    (
        2,
        "tailer_cursor",
        include_str!("../migrations/0002_tailer_cursor.sql"),
    ),
    (
        3,
        "unprotected_hourly",
        include_str!("../migrations/0003_unprotected_hourly.sql"),
    ),
    (
        4,
        "audit_history",
        include_str!("../migrations/0004_audit_history.sql"),
    ),
    (
        5,
        "force_release_grant",
        include_str!("../migrations/0005_force_release_grant.sql"),
    ),
    (
        6,
        "fence_reset",
        include_str!("../migrations/0006_fence_reset.sql"),
    ),
    (
        7,
        "dashboard_overview",
        include_str!("../migrations/0007_dashboard_overview.sql"),
    ),
    (
        8,
        "unprotected_resource_scan",
        include_str!("../migrations/0008_unprotected_resource_scan.sql"),
    ),
    (
        9,
        "epoch_event",
        include_str!("../migrations/0009_epoch_event.sql"),
    ),
    (
        10,
        "overview_rollups",
        include_str!("../migrations/0010_overview_rollups.sql"),
    ),
    (
        11,
        "fence_reset_lock",
        include_str!("../migrations/0011_fence_reset_lock.sql"),
    ),
];

/// The advisory lock key that serializes migrations across processes ("paud").
const LOCK_KEY: i64 = 0x7061_7564;

/// Applies the migrations that are not applied yet. Idempotent, and safe to run from
/// several processes at once (a transaction-scoped advisory lock serializes them).
///
/// Returns the versions applied by this call (empty when the schema was current).
///
/// # Errors
///
/// [`AuditError::Pool`] when no connection can be had, [`AuditError::Database`] when a
/// statement fails (nothing of the failing migration is kept).
pub async fn migrate(pool: &Pool) -> Result<Vec<i32>, AuditError> {
    let mut client = pool.get().await?;
    migrate_client(&mut client).await
}

/// [`migrate`] on one connection.
///
/// # Errors
///
/// [`AuditError::Database`] when a statement fails.
pub async fn migrate_client(client: &mut tokio_postgres::Client) -> Result<Vec<i32>, AuditError> {
    let mut applied = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
            .await?;
        // The notices of a schema already in place ("already exists, skipping") are not
        // news; warnings still reach the log.
        tx.batch_execute(
            "SET LOCAL client_min_messages = warning; \
             CREATE TABLE IF NOT EXISTS audit_schema_migrations (\
                version integer PRIMARY KEY, name text NOT NULL, \
                applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
        let done = tx
            .query_opt(
                "SELECT 1 FROM audit_schema_migrations WHERE version = $1",
                &[version],
            )
            .await?;
        if done.is_none() {
            tx.batch_execute(sql).await?;
            tx.execute(
                "INSERT INTO audit_schema_migrations (version, name) VALUES ($1, $2)",
                &[version, name],
            )
            .await?;
            applied.push(*version);
        }
        tx.commit().await?;
    }
    Ok(applied)
}

/// Whether the schema is current on `client` (every migration applied).
///
/// # Errors
///
/// [`AuditError::Database`] when the query fails.
pub async fn is_current<C: GenericClient>(client: &C) -> Result<bool, AuditError> {
    let table: Option<String> = client
        .query_one("SELECT to_regclass('audit_schema_migrations')::text", &[])
        .await?
        .get(0);
    if table.is_none() {
        return Ok(false);
    }
    let n: i64 = client
        .query_one("SELECT count(*) FROM audit_schema_migrations", &[])
        .await?
        .get(0);
    Ok(n as usize == MIGRATIONS.len())
}
