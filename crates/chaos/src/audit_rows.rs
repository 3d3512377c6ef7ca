//! The audit trail read back after a run, as [`Event::AuditRow`] entries.

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::error::ChaosError;
use crate::history::{Event, LockName};
use crate::worker::{CLASS, NAMESPACE};

/// A cluster restored from a snapshot, whose audit rows about the snapshot's holds are
/// not new events:
///
/// - it carries the old cluster's history up to the snapshot's revision, and the tailer
///   reads it again under the new cluster id (rows at or below `through`);
/// - holds the snapshot held come back, and end again in the new cluster (rows about a
///   token whose grant revision is at or below `through`, from an epoch before the one
///   the cluster serves). Those holds were reported from the cluster they were granted
///   in; etcd's history of the new cluster is read the same way (`etcd_history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// The restored cluster's id.
    pub(crate) cluster_id: u64,
    /// The snapshot's revision.
    pub(crate) through: i64,
    /// The epoch the restored cluster serves.
    pub(crate) epoch: u16,
}

impl Replayed {
    fn covers(&self, cluster: i64, revision: i64, token: Option<u64>) -> bool {
        if self.cluster_id as i64 != cluster {
            return false;
        }
        let restored_hold = token.is_some_and(|t| {
            (t >> 48) < u64::from(self.epoch) && (t & ((1 << 48) - 1)) as i64 <= self.through
        });
        revision <= self.through || restored_hold
    }
}

/// What the audit trail holds.
#[derive(Debug, Default)]
pub(crate) struct AuditRead {
    pub(crate) rows: Vec<Event>,
    /// Rows left out as restored history (see [`Replayed`]).
    pub(crate) replayed: u64,
    /// `gap` rows: revisions the tailer could not read (compaction).
    pub(crate) gaps: u64,
}

/// Waits until the tailer has stored cluster `cluster_id` through `revision` (at most
/// `limit`); `false` if it did not.
pub(crate) async fn wait_for_tailer(
    pool: &Pool,
    cluster_id: u64,
    revision: i64,
    limit: Duration,
) -> Result<bool, ChaosError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Ok(client) = pool.get().await {
            let at =
                palisade_audit::tailer_position(&**client, palisade_audit::ClusterId(cluster_id))
                    .await?;
            if at.is_some_and(|r| r.as_i64() >= revision) {
                return Ok(true);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The last revision of cluster `cluster_id` the tailer has stored (0: none).
pub(crate) async fn tailer_through(pool: &Pool, cluster_id: u64) -> Result<i64, ChaosError> {
    let client = pool
        .get()
        .await
        .map_err(|e| ChaosError::NotReady(format!("the audit database ({e})")))?;
    let at =
        palisade_audit::tailer_position(&**client, palisade_audit::ClusterId(cluster_id)).await?;
    Ok(at.map_or(0, |r| r.as_i64()))
}

/// Reads lock events (without copies of restored history), the force release records,
/// and unprotected writes.
pub(crate) async fn read(pool: &Pool, replayed: &[Replayed]) -> Result<AuditRead, ChaosError> {
    let client = pool
        .get()
        .await
        .map_err(|e| ChaosError::NotReady(format!("the audit database ({e})")))?;
    let mut out = AuditRead::default();
    let rows = client
        .query(
            "SELECT cluster_id, revision, type, namespace, class, lock_key, token FROM audit_event \
             ORDER BY recorded_at, cluster_id, revision, seq",
            &[],
        )
        .await
        .map_err(ChaosError::pg("reading audit_event"))?;
    for r in rows {
        let (cluster, revision, kind): (i64, i64, String) = (r.get(0), r.get(1), r.get(2));
        if kind == "gap" {
            out.gaps += 1;
            continue;
        }
        let token = r.get::<_, Option<i64>>(6).map(|t| t as u64);
        if replayed.iter().any(|p| p.covers(cluster, revision, token)) {
            out.replayed += 1;
            continue;
        }
        let lock = match (
            r.get::<_, Option<String>>(3),
            r.get::<_, Option<String>>(4),
            r.get::<_, Option<String>>(5),
        ) {
            (Some(ns), Some(class), Some(key)) => Some(LockName { ns, class, key }),
            _ => None,
        };
        out.rows.push(Event::AuditRow {
            kind,
            lock,
            resource: None,
            token,
            revision: Some(revision),
        });
    }
    // The approving replica's records of force releases. They name the key only: the
    // workload locks in one namespace and class.
    let forces = client
        .query(
            "SELECT cluster_id, revision, lock_key, token FROM force_release ORDER BY at, request_id",
            &[],
        )
        .await
        .map_err(ChaosError::pg("reading force_release"))?;
    for r in forces {
        let (cluster, revision, key): (i64, i64, String) = (r.get(0), r.get(1), r.get(2));
        let token = r.get::<_, Option<i64>>(3).map(|t| t as u64);
        if replayed.iter().any(|p| p.covers(cluster, revision, token)) {
            out.replayed += 1;
            continue;
        }
        out.rows.push(Event::AuditRow {
            kind: "force_release".into(),
            lock: Some(LockName {
                ns: NAMESPACE.into(),
                class: CLASS.into(),
                key,
            }),
            resource: None,
            token,
            revision: Some(revision),
        });
    }
    let writes = client
        .query(
            "SELECT resource, token FROM write_event WHERE outcome = 'unprotected' ORDER BY at, id",
            &[],
        )
        .await
        .map_err(ChaosError::pg("reading write_event"))?;
    for r in writes {
        out.rows.push(Event::AuditRow {
            kind: "unprotected_write".into(),
            lock: None,
            resource: r.get(0),
            token: r.get::<_, Option<i64>>(1).map(|t| t as u64),
            revision: None,
        });
    }
    Ok(out)
}
