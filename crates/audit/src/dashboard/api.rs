//! The JSON API: the same data as the pages.

use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::Json;
use deadpool_postgres::Pool;
use palisade_fence::FencingToken;
use serde::Serialize;
use uuid::Uuid;

use super::pages::KeyParams;
use super::query::{self, FilterParams};
use super::timeline::{self, KeyQuery, TimelineEntry};
use super::{chart_window, rfc3339, DashError};
use crate::{reason_str, ClusterId, EpochAdvance, ForceRelease, WriteRecord};

/// One unprotected write.
#[derive(Debug, Serialize)]
pub(super) struct WriteJson {
    id: Uuid,
    at: String,
    service: String,
    resource: Option<String>,
    method: Option<String>,
    token: Option<FencingToken>,
    highest: Option<FencingToken>,
    finding: Option<&'static str>,
    enforcement: Option<&'static str>,
    namespace: Option<String>,
    class: Option<String>,
    caller: Option<String>,
}

impl From<WriteRecord> for WriteJson {
    fn from(r: WriteRecord) -> Self {
        WriteJson {
            id: r.id,
            at: rfc3339(r.at),
            service: r.service,
            resource: r.resource,
            method: r.method,
            token: r.token,
            highest: r.highest,
            finding: r.finding.map(|f| f.as_str()),
            enforcement: r.fenced.map(|f| if f { "fenced" } else { "advisory" }),
            namespace: r.labels.namespace,
            class: r.labels.class,
            caller: r.caller,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Page {
    rows: Vec<WriteJson>,
    /// The `before` cursor of the next (older) page.
    next: Option<String>,
}

pub(super) async fn unprotected(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<Json<Page>, DashError> {
    let (filter, cursor, limit) = params.parse()?;
    let client = pool.get().await?;
    let (rows, next) =
        query::writes_page(&**client, query::UNPROTECTED, &filter, cursor, limit).await?;
    Ok(Json(Page {
        rows: rows.into_iter().map(WriteJson::from).collect(),
        next: next.map(|c| c.encode()),
    }))
}

/// The refused writes, as the unprotected ones (`finding` is the reason; `highest` the
/// resource's mark for a stale token).
pub(super) async fn refused(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<Json<Page>, DashError> {
    let (filter, cursor, limit) = params.parse()?;
    let client = pool.get().await?;
    let (rows, next) =
        query::writes_page(&**client, query::REFUSED, &filter, cursor, limit).await?;
    Ok(Json(Page {
        rows: rows.into_iter().map(WriteJson::from).collect(),
        next: next.map(|c| c.encode()),
    }))
}

#[derive(Debug, Serialize)]
pub(super) struct Hour {
    hour: String,
    count: i64,
}

#[derive(Debug, Serialize)]
pub(super) struct Hourly {
    hours: Vec<Hour>,
}

pub(super) async fn hourly(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<Json<Hourly>, DashError> {
    let (filter, _, _) = params.parse()?;
    let client = pool.get().await?;
    let (from, to) = chart_window(&filter);
    let hours = query::hourly(&**client, &filter, from, to).await?;
    Ok(Json(Hourly {
        hours: hours
            .into_iter()
            .map(|(h, count)| Hour {
                hour: rfc3339(h),
                count,
            })
            .collect(),
    }))
}

#[derive(Debug, Serialize)]
pub(super) struct ForceJson {
    request_id: String,
    cluster_id: String,
    revision: u64,
    grant_rev: Option<u64>,
    token: Option<FencingToken>,
    lock_key: String,
    requester: String,
    approver: String,
    reason: String,
    class_was_fenced: bool,
    at: String,
}

impl From<ForceRelease> for ForceJson {
    fn from(f: ForceRelease) -> Self {
        ForceJson {
            request_id: f.request_id,
            cluster_id: f.cluster_id.to_string(),
            revision: f.revision.get(),
            grant_rev: f.grant_rev.map(palisade_fence::Revision::get),
            token: f.token,
            lock_key: f.lock_key,
            requester: f.requester,
            approver: f.approver,
            reason: f.reason,
            class_was_fenced: f.class_was_fenced,
            at: rfc3339(f.at),
        }
    }
}

/// An epoch advance as the JSON timeline carries it.
#[derive(Debug, Serialize)]
pub(super) struct EpochJson {
    epoch: u16,
    reason: &'static str,
    /// The etcd cluster id the record names (16 hex digits).
    epoch_cluster_id: String,
    /// The revision etcd was at when the epoch started.
    start_revision: u64,
    advanced_at: String,
    /// For a rehome whose switch was recorded: the namespace and its tiers.
    namespace: Option<String>,
    from_tier: Option<String>,
    to_tier: Option<String>,
}

impl From<EpochAdvance> for EpochJson {
    fn from(a: EpochAdvance) -> Self {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(a.record.advanced_at_ms);
        let (namespace, from_tier, to_tier) = match a.rehome {
            Some(r) => (Some(r.namespace), Some(r.from), Some(r.to)),
            None => (None, None, None),
        };
        EpochJson {
            epoch: a.record.epoch.get(),
            reason: reason_str(a.record.reason),
            epoch_cluster_id: ClusterId(a.record.cluster_id).to_string(),
            start_revision: a.record.highest_grant_rev.get(),
            advanced_at: rfc3339(at),
            namespace,
            from_tier,
            to_tier,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct EventJson {
    cluster_id: String,
    revision: u64,
    seq: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    lock_key: Option<String>,
    /// For a gap: the first and last revision not read.
    gap_from: Option<u64>,
    gap_to: Option<u64>,
    token: Option<FencingToken>,
    spiffe_id: Option<String>,
    namespace: Option<String>,
    class: Option<String>,
    recorded_at: Option<String>,
    force: Option<ForceJson>,
    /// For an epoch advance (`type` `epoch`): the new epoch, why, and a rehome's move.
    epoch: Option<EpochJson>,
}

#[derive(Debug, Serialize)]
pub(super) struct Timeline {
    key: String,
    events: Vec<EventJson>,
}

pub(super) async fn locks(
    State(pool): State<Pool>,
    Query(params): Query<KeyParams>,
) -> Result<Json<Timeline>, DashError> {
    let key = params.key()?.unwrap_or_default().to_owned();
    let client = pool.get().await?;
    let entries = if key.is_empty() {
        Vec::new()
    } else {
        timeline::lock_timeline(&**client, &KeyQuery::parse(&key), query::PAGE_MAX).await?
    };
    let events = entries
        .into_iter()
        .map(
            |TimelineEntry {
                 event: e,
                 force,
                 advance,
             }| EventJson {
                cluster_id: e.cluster_id.to_string(),
                revision: e.revision.get(),
                seq: e.seq,
                kind: e.kind.as_str(),
                lock_key: e.lock_key,
                gap_from: e.gap.map(|g| g.0.get()),
                gap_to: e.gap.map(|g| g.1.get()),
                token: e.token,
                spiffe_id: e.spiffe_id,
                namespace: e.namespace,
                class: e.class,
                recorded_at: e.recorded_at.map(|t: SystemTime| rfc3339(t)),
                force: force.map(ForceJson::from),
                epoch: advance.map(EpochJson::from),
            },
        )
        .collect();
    Ok(Json(Timeline { key, events }))
}

#[derive(Debug, Serialize)]
pub(super) struct Forces {
    force_releases: Vec<ForceJson>,
}

pub(super) async fn force_releases(
    State(pool): State<Pool>,
    Query(params): Query<KeyParams>,
) -> Result<Json<Forces>, DashError> {
    let window = params.window()?;
    let client = pool.get().await?;
    let rows = query::force_releases(&**client, &window, query::PAGE_MAX).await?;
    Ok(Json(Forces {
        force_releases: rows.into_iter().map(ForceJson::from).collect(),
    }))
}
