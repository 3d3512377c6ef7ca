//! Epoch advances and rehome switches (from etcd history): the `epoch_event` and
//! `rehome_event` rows.
//!
//! An epoch advance is what cuts a lock's token sequence: every token after it carries
//! the new epoch. Its reason says why (`restore`: etcd was restored from a snapshot;
//! `rehome`: a namespace moved to this cluster's tier). A rehome's advance is written on
//! the new tier's etcd, its switch (which names the namespace and both tiers) on the home
//! tier's: [`EpochAdvance::rehome`] joins them by epoch, which is one sequence across
//! tiers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use palisade_api::{EpochReason, EpochRecord, RehomePhase, RehomeRecord};
use palisade_fence::{Epoch, Revision};
use tokio_postgres::GenericClient;

use crate::{AuditError, ClusterId};

/// One `epoch_event` row: an epoch record (`config/epoch`) written in a tailed etcd
/// cluster. `(cluster_id, revision)` is the key, and the record's own
/// `(cluster_id, epoch)` is unique: storing it twice, or reading it again in a restored
/// cluster's history, stores it once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EpochAdvance {
    /// The etcd cluster whose history had the record (where it was read).
    pub cluster_id: ClusterId,
    /// The revision that wrote the record.
    pub revision: Revision,
    /// The record as written: epoch, reason, the cluster it names, when it started and
    /// the revision etcd was at.
    pub record: EpochRecord,
    /// For a rehome's advance, the move it belongs to, when the home tier's switch was
    /// recorded too (filled in by the dashboard's reads, never stored in this row).
    pub rehome: Option<RehomeSwitch>,
    /// When the row was stored; set by the database.
    pub recorded_at: Option<SystemTime>,
}

impl EpochAdvance {
    /// The row for `record`, read in `cluster` at `revision`.
    pub fn new(cluster_id: ClusterId, revision: Revision, record: EpochRecord) -> Self {
        EpochAdvance {
            cluster_id,
            revision,
            record,
            rehome: None,
            recorded_at: None,
        }
    }
}

/// One `rehome_event` row: the commit point of a rehome, read from the home tier's
/// history (`tier/rehome/<ns>` rewritten to phase `switched`). `(cluster_id, revision)`
/// is the key and `(namespace, epoch)` is unique.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RehomeSwitch {
    /// The home tier's etcd cluster.
    pub cluster_id: ClusterId,
    /// The revision of the switch.
    pub revision: Revision,
    /// The namespace moved.
    pub namespace: String,
    /// The tier it left.
    pub from: String,
    /// The tier it moved to.
    pub to: String,
    /// The epoch `to` serves it under (joins [`EpochAdvance`]).
    pub epoch: Epoch,
    /// When the row was stored; set by the database.
    pub recorded_at: Option<SystemTime>,
}

impl RehomeSwitch {
    /// The switch a rehome record's value describes: `Some` only for phase `switched`
    /// with its epoch set (the draining record, written at the claim, moved nothing).
    pub fn from_record(cluster_id: ClusterId, revision: Revision, r: RehomeRecord) -> Option<Self> {
        match (r.phase, r.epoch) {
            (RehomePhase::Switched, Some(epoch)) => Some(RehomeSwitch {
                cluster_id,
                revision,
                namespace: r.ns,
                from: r.from,
                to: r.to,
                epoch,
                recorded_at: None,
            }),
            _ => None,
        }
    }
}

/// The value stored in `epoch_event.reason`.
pub fn reason_str(reason: EpochReason) -> &'static str {
    match reason {
        EpochReason::Bootstrap => "bootstrap",
        EpochReason::Restore => "restore",
        EpochReason::Rehome => "rehome",
    }
}

fn parse_reason(s: &str) -> Option<EpochReason> {
    Some(match s {
        "bootstrap" => EpochReason::Bootstrap,
        "restore" => EpochReason::Restore,
        "rehome" => EpochReason::Rehome,
        _ => return None,
    })
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Inserts epoch advances; a row whose key or record identity is stored is skipped.
/// Returns how many were inserted.
///
/// # Errors
///
/// [`AuditError::Database`] when a statement fails.
pub async fn insert_epoch_advances<C: GenericClient>(
    client: &C,
    rows: &[EpochAdvance],
) -> Result<u64, AuditError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let statement = client
        .prepare(
            "INSERT INTO epoch_event \
             (cluster_id, revision, epoch, reason, epoch_cluster_id, advanced_at, start_revision) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .await?;
    let mut n = 0;
    for e in rows {
        let advanced_at = UNIX_EPOCH + Duration::from_millis(e.record.advanced_at_ms);
        n += client
            .execute(
                &statement,
                &[
                    &e.cluster_id.to_sql(),
                    &e.revision.as_i64(),
                    &i32::from(e.record.epoch.get()),
                    &reason_str(e.record.reason),
                    &ClusterId(e.record.cluster_id).to_sql(),
                    &advanced_at,
                    &e.record.highest_grant_rev.as_i64(),
                ],
            )
            .await?;
    }
    Ok(n)
}

/// Inserts rehome switches; a row whose key or `(namespace, epoch)` is stored is
/// skipped. Returns how many were inserted.
///
/// # Errors
///
/// [`AuditError::Database`] when a statement fails.
pub async fn insert_rehome_switches<C: GenericClient>(
    client: &C,
    rows: &[RehomeSwitch],
) -> Result<u64, AuditError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let statement = client
        .prepare(
            "INSERT INTO rehome_event (cluster_id, revision, namespace, from_tier, to_tier, epoch) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .await?;
    let mut n = 0;
    for s in rows {
        n += client
            .execute(
                &statement,
                &[
                    &s.cluster_id.to_sql(),
                    &s.revision.as_i64(),
                    &s.namespace,
                    &s.from,
                    &s.to,
                    &i32::from(s.epoch.get()),
                ],
            )
            .await?;
    }
    Ok(n)
}

/// The epoch advances recorded in `clusters` (in every cluster when empty), newest
/// first, at most `limit`, each with its rehome switch when one was recorded; without
/// the bootstraps (epochs that cut no history) unless `bootstraps`.
///
/// # Errors
///
/// [`AuditError::Database`] when the query fails.
pub async fn epoch_advances<C: GenericClient>(
    client: &C,
    clusters: &[i64],
    bootstraps: bool,
    limit: i64,
) -> Result<Vec<EpochAdvance>, AuditError> {
    let rows = client
        .query(
            "SELECT e.cluster_id, e.revision, e.epoch, e.reason, e.epoch_cluster_id, e.advanced_at, \
                    e.start_revision, e.recorded_at, \
                    r.cluster_id, r.revision, r.namespace, r.from_tier, r.to_tier, r.recorded_at \
             FROM epoch_event e \
             LEFT JOIN LATERAL (SELECT * FROM rehome_event r WHERE e.reason = 'rehome' AND r.epoch = e.epoch \
                 ORDER BY r.recorded_at LIMIT 1) r ON true \
             WHERE (cardinality($1::bigint[]) = 0 OR e.cluster_id = ANY($1)) \
                 AND ($2 OR e.reason <> 'bootstrap') \
             ORDER BY e.recorded_at DESC, e.revision DESC LIMIT $3",
            &[&clusters, &bootstraps, &limit],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let (Ok(epoch), Some(reason)) = (
            Epoch::new(r.get::<_, i32>(2).clamp(0, i32::from(u16::MAX)) as u16),
            parse_reason(r.get(3)),
        ) else {
            continue;
        };
        let revision = |i: usize| Revision::new(r.get::<_, i64>(i).max(0) as u64);
        let mut record =
            EpochRecord::new(epoch, ClusterId::from_sql(r.get(4)).0, reason, revision(6));
        record.advanced_at_ms = millis(r.get(5));
        let rehome = r
            .get::<_, Option<String>>(10)
            .map(|namespace| RehomeSwitch {
                cluster_id: ClusterId::from_sql(r.get(8)),
                revision: revision(9),
                namespace,
                from: r.get(11),
                to: r.get(12),
                epoch,
                recorded_at: Some(r.get(13)),
            });
        out.push(EpochAdvance {
            cluster_id: ClusterId::from_sql(r.get(0)),
            revision: revision(1),
            record,
            rehome,
            recorded_at: Some(r.get(7)),
        });
    }
    Ok(out)
}
