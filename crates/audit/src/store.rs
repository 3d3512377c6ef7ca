//! Idempotent inserts of audit rows.

use std::time::SystemTime;

use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::{AuditError, FenceReset, ForceRelease, LockEvent, WriteRecord};

/// One statement for any number of rows: the columns go as arrays and `unnest` turns them
/// into rows. `ON CONFLICT DO NOTHING` makes a replay harmless.
const INSERT_WRITES: &str = "INSERT INTO write_event \
    (id, at, service, outcome, resource, method, token, highest, finding, enforcement, namespace, class, caller, dropped) \
    SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], \
        $7::bigint[], $8::bigint[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::bigint[]) \
    ON CONFLICT (id) DO NOTHING";

/// Inserts write events in one statement; rows whose id is already stored are skipped.
///
/// Returns how many rows were inserted (so `records.len()` minus the duplicates).
///
/// # Errors
///
/// [`AuditError::Database`] when the statement fails (then nothing was inserted).
pub async fn insert_writes<C: GenericClient>(
    client: &C,
    records: &[WriteRecord],
) -> Result<u64, AuditError> {
    if records.is_empty() {
        return Ok(0);
    }
    let col =
        |f: &dyn Fn(&WriteRecord) -> Option<String>| records.iter().map(f).collect::<Vec<_>>();
    let ids: Vec<Uuid> = records.iter().map(|r| r.id).collect();
    let ats: Vec<SystemTime> = records.iter().map(|r| r.at).collect();
    let services = col(&|r| Some(r.service.clone()));
    let outcomes = col(&|r| Some(r.outcome.as_str().to_owned()));
    let resources = col(&|r| r.resource.clone());
    let methods = col(&|r| r.method.clone());
    let tokens: Vec<Option<i64>> = records
        .iter()
        .map(|r| r.token.map(|t| t.get() as i64))
        .collect();
    let highest: Vec<Option<i64>> = records
        .iter()
        .map(|r| r.highest.map(|t| t.get() as i64))
        .collect();
    let findings = col(&|r| r.finding.map(|f| f.as_str().to_owned()));
    let enforcement = col(&|r| {
        r.fenced
            .map(|f| if f { "fenced" } else { "advisory" }.to_owned())
    });
    let namespaces = col(&|r| r.labels.namespace.clone());
    let classes = col(&|r| r.labels.class.clone());
    let callers = col(&|r| r.caller.clone());
    let dropped: Vec<Option<i64>> = records
        .iter()
        .map(|r| r.dropped.map(|n| n.min(i64::MAX as u64) as i64))
        .collect();
    let n = client
        .execute(
            INSERT_WRITES,
            &[
                &ids,
                &ats,
                &services,
                &outcomes,
                &resources,
                &methods,
                &tokens,
                &highest,
                &findings,
                &enforcement,
                &namespaces,
                &classes,
                &callers,
                &dropped,
            ],
        )
        .await?;
    Ok(n)
}

/// Inserts lock events; an event whose `(cluster_id, revision, seq)` is stored is skipped.
///
/// Returns how many rows were inserted.
///
/// # Errors
///
/// [`AuditError::Database`] when a statement fails.
pub async fn insert_lock_events<C: GenericClient>(
    client: &C,
    events: &[LockEvent],
) -> Result<u64, AuditError> {
    let statement = client
        .prepare(
            "INSERT INTO audit_event \
             (cluster_id, revision, seq, type, lock_key, namespace, class, spiffe_id, token, gap_from, gap_to) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (cluster_id, revision, seq) DO NOTHING",
        )
        .await?;
    let mut n = 0;
    for e in events {
        let seq = e.seq.min(i32::MAX as u32) as i32;
        n += client
            .execute(
                &statement,
                &[
                    &e.cluster_id.to_sql(),
                    &e.revision.as_i64(),
                    &seq,
                    &e.kind.as_str(),
                    &e.lock_key,
                    &e.namespace,
                    &e.class,
                    &e.spiffe_id,
                    &e.token.map(|t| t.get() as i64),
                    &e.gap.map(|g| g.0.as_i64()),
                    &e.gap.map(|g| g.1.as_i64()),
                ],
            )
            .await?;
    }
    Ok(n)
}

/// Inserts a forced release; a stored `request_id` is skipped. Returns whether it was new.
///
/// # Errors
///
/// [`AuditError::Database`] when the statement fails (for example a requester who is
/// also the approver: SQLSTATE 23514).
pub async fn insert_force_release<C: GenericClient>(
    client: &C,
    f: &ForceRelease,
) -> Result<bool, AuditError> {
    let n = client
        .execute(
            "INSERT INTO force_release \
             (request_id, cluster_id, revision, lock_key, requester, approver, reason, class_was_fenced, at, grant_rev, token) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (request_id) DO NOTHING",
            &[
                &f.request_id,
                &f.cluster_id.to_sql(),
                &f.revision.as_i64(),
                &f.lock_key,
                &f.requester,
                &f.approver,
                &f.reason,
                &f.class_was_fenced,
                &f.at,
                &f.grant_rev.map(palisade_fence::Revision::as_i64),
                &f.token.map(i64::from),
            ],
        )
        .await?;
    Ok(n == 1)
}

/// Records a reset of a resource's high-water mark (`palisade fence reset`); a row whose
/// id is already stored is skipped. Returns whether the row was inserted.
///
/// # Errors
///
/// [`AuditError::Database`] when the statement fails.
pub async fn insert_fence_reset<C: GenericClient>(
    client: &C,
    r: &FenceReset,
) -> Result<bool, AuditError> {
    let n = client
        .execute(
            "INSERT INTO fence_reset (id, at, resource, old_token, new_token, reason, actor, \
             lock_key, lock_floor) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING",
            &[
                &r.id,
                &r.at,
                &r.resource,
                &(r.old.get() as i64),
                &(r.new.get() as i64),
                &r.reason,
                &r.actor,
                &r.lock.as_ref().map(|(k, _)| k.as_str()),
                &r.lock.as_ref().map(|(_, f)| f.get() as i64),
            ],
        )
        .await?;
    Ok(n == 1)
}
