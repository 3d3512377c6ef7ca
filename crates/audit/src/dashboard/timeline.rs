//! A lock's timeline: its events from etcd history, with the times they were recorded,
//! the etcd cluster and tier, and what cut the history: the audit gaps, and the epoch
//! advances (restore, rehome) after which its tokens carry a new epoch.

use std::collections::{BTreeSet, HashMap};

use palisade_fence::{FencingToken, Revision};
use tokio_postgres::{GenericClient, Row};

use crate::{
    epoch_advances, AuditError, ClusterId, EpochAdvance, ForceRelease, LockEvent, LockEventKind,
};

/// Most gaps, and most epoch advances, listed on one timeline.
const GAPS_MAX: i64 = 100;
/// Most keys offered by the key field.
const SUGGESTIONS: i64 = 1000;

/// A lock event with, for forced releases, who forced it and why; or an epoch advance
/// (`event.kind` [`LockEventKind::Epoch`], placed at its cluster and revision).
#[derive(Debug, Clone)]
pub(crate) struct TimelineEntry {
    pub(crate) event: LockEvent,
    pub(crate) force: Option<ForceRelease>,
    pub(crate) advance: Option<EpochAdvance>,
}

impl TimelineEntry {
    fn advance(a: EpochAdvance) -> Self {
        let mut event = LockEvent::gap(a.cluster_id, a.revision, a.revision);
        event.kind = LockEventKind::Epoch;
        event.gap = None;
        event.namespace = a.rehome.as_ref().map(|r| r.namespace.clone());
        event.recorded_at = a.recorded_at;
        TimelineEntry {
            event,
            force: None,
            advance: Some(a),
        }
    }
}

/// What the timeline field asked for: a bare lock key, or the `ns/class/key` form used
/// everywhere else (`palisade lock acquire orders/invoices/invoice-42`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyQuery {
    /// As typed (trimmed): matched against `lock_key` as a whole too.
    pub(crate) raw: String,
    /// `(namespace, class, key)` when the first two segments are names.
    pub(crate) full: Option<(String, String, String)>,
}

impl KeyQuery {
    pub(crate) fn parse(raw: &str) -> Self {
        let full = raw.split_once('/').and_then(|(ns, rest)| {
            let (class, key) = rest.split_once('/')?;
            (palisade_api::is_name(ns) && palisade_api::is_name(class) && !key.is_empty())
                .then(|| (ns.to_owned(), class.to_owned(), key.to_owned()))
        });
        KeyQuery {
            raw: raw.to_owned(),
            full,
        }
    }
}

const EVENT_COLUMNS: &str = "e.cluster_id, e.revision, e.seq, e.type, e.lock_key, e.namespace, e.class, \
    e.spiffe_id, e.token, e.recorded_at, e.gap_from, e.gap_to, f.request_id, f.requester, f.approver, \
    f.reason, f.class_was_fenced, f.at";

fn token(v: Option<i64>) -> Option<FencingToken> {
    v.and_then(|t| FencingToken::try_from(t).ok())
}

fn revision(v: i64) -> Revision {
    Revision::new(v.max(0) as u64)
}

fn entry(r: &Row) -> TimelineEntry {
    let cluster_id = ClusterId::from_sql(r.get(0));
    let rev = revision(r.get(1));
    let kind = LockEventKind::parse(r.get(3)).unwrap_or(LockEventKind::Gap);
    let mut event = match (
        kind,
        r.get::<_, Option<i64>>(10),
        r.get::<_, Option<i64>>(11),
    ) {
        (LockEventKind::Gap, Some(from), Some(to)) => {
            LockEvent::gap(cluster_id, revision(from), revision(to))
        }
        _ => LockEvent::new(
            cluster_id,
            rev,
            kind,
            r.get::<_, Option<String>>(4).unwrap_or_default(),
        ),
    };
    event.seq = r.get::<_, i32>(2).max(0) as u32;
    event.namespace = r.get(5);
    event.class = r.get(6);
    event.spiffe_id = r.get(7);
    event.token = token(r.get(8));
    event.recorded_at = Some(r.get(9));
    let force = r.get::<_, Option<String>>(12).map(|request_id| {
        ForceRelease::new(
            request_id,
            cluster_id,
            rev,
            event.lock_key.clone().unwrap_or_default(),
            r.get::<_, String>(13),
            r.get::<_, String>(14),
            r.get::<_, String>(15),
            r.get(16),
            r.get(17),
        )
    });
    TimelineEntry {
        event,
        force,
        advance: None,
    }
}

/// The events of the lock `q` names, and the gaps and epoch advances (not bootstraps) of
/// the clusters they happened on (of every cluster when it has none: its events may all
/// be in a gap), newest first (at most `limit` events, 100 gaps and 100 advances).
///
/// Order: clusters by their newest recorded row, newest first; within a cluster by
/// revision (a gap sits at its first unread revision), newest first. etcd history has no
/// timestamps: a row's time is when the tailer stored it.
pub(crate) async fn lock_timeline<C: GenericClient>(
    client: &C,
    q: &KeyQuery,
    limit: usize,
) -> Result<Vec<TimelineEntry>, AuditError> {
    let join = "LEFT JOIN force_release f ON e.type = 'force' AND f.cluster_id = e.cluster_id \
                AND f.revision = e.revision AND f.lock_key = e.lock_key";
    let limit = limit as i64;
    let rows = match &q.full {
        Some((ns, class, key)) => {
            client
                .query(
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM audit_event e {join} \
                         WHERE (e.namespace = $1 AND e.class = $2 AND e.lock_key = $3) OR e.lock_key = $4 \
                         ORDER BY e.revision DESC, e.seq DESC LIMIT $5"
                    ),
                    &[ns, class, key, &q.raw, &limit],
                )
                .await?
        }
        None => {
            client
                .query(
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM audit_event e {join} WHERE e.lock_key = $1 \
                         ORDER BY e.revision DESC, e.seq DESC LIMIT $2"
                    ),
                    &[&q.raw, &limit],
                )
                .await?
        }
    };
    let mut entries: Vec<TimelineEntry> = rows.iter().map(entry).collect();
    let clusters: Vec<i64> = entries
        .iter()
        .map(|e| e.event.cluster_id.to_sql())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let gaps = client
        .query(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM audit_event e {join} \
                 WHERE e.type = 'gap' AND (cardinality($1::bigint[]) = 0 OR e.cluster_id = ANY($1)) \
                 ORDER BY e.revision DESC LIMIT $2"
            ),
            &[&clusters, &GAPS_MAX],
        )
        .await?;
    entries.extend(gaps.iter().map(entry));
    let advances = epoch_advances(client, &clusters, false, GAPS_MAX).await?;
    entries.extend(advances.into_iter().map(TimelineEntry::advance));
    order(&mut entries);
    Ok(entries)
}

/// Sorts newest first: clusters by their newest recorded row, then revision and seq.
fn order(entries: &mut [TimelineEntry]) {
    let mut newest: HashMap<ClusterId, std::time::SystemTime> = HashMap::new();
    for e in entries.iter() {
        if let Some(at) = e.event.recorded_at {
            let n = newest.entry(e.event.cluster_id).or_insert(at);
            *n = (*n).max(at);
        }
    }
    entries.sort_by(|a, b| {
        let (a, b) = (&a.event, &b.event);
        newest
            .get(&b.cluster_id)
            .cmp(&newest.get(&a.cluster_id))
            .then(b.cluster_id.cmp(&a.cluster_id))
            .then(b.revision.cmp(&a.revision))
            .then(b.seq.cmp(&a.seq))
    });
}

/// Whether the timeline has rows other than gaps and epoch advances.
pub(crate) fn has_events(entries: &[TimelineEntry]) -> bool {
    entries
        .iter()
        .any(|e| !matches!(e.event.kind, LockEventKind::Gap | LockEventKind::Epoch))
}

/// The most recently granted locks, as `ns/class/key` (or the bare key when its
/// namespace or class is unknown), each once, newest first.
pub(crate) async fn known_keys<C: GenericClient>(client: &C) -> Result<Vec<String>, AuditError> {
    let rows = client
        .query(
            "SELECT namespace, class, lock_key FROM audit_event WHERE type = 'grant' \
             ORDER BY revision DESC LIMIT $1",
            &[&SUGGESTIONS],
        )
        .await?;
    let mut seen = BTreeSet::new();
    let mut keys = Vec::new();
    for r in &rows {
        let (ns, class, key): (Option<String>, Option<String>, Option<String>) =
            (r.get(0), r.get(1), r.get(2));
        let Some(key) = key else { continue };
        let name = match (ns, class) {
            (Some(ns), Some(class)) => format!("{ns}/{class}/{key}"),
            _ => key,
        };
        if seen.insert(name.clone()) {
            keys.push(name);
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::KeyQuery;

    #[test]
    fn the_full_name_splits_at_the_first_two_slashes_only_when_they_are_names() {
        let q = KeyQuery::parse("orders/invoices/invoice-42");
        assert_eq!(
            q.full,
            Some(("orders".into(), "invoices".into(), "invoice-42".into()))
        );
        let q = KeyQuery::parse("orders/invoices/a/b");
        assert_eq!(q.full.unwrap().2, "a/b");
        assert_eq!(KeyQuery::parse("/palisade/shop/orders/42").full, None);
        assert_eq!(KeyQuery::parse("invoice-42").full, None);
        assert_eq!(KeyQuery::parse("Orders/x/y").full, None);
        assert_eq!(KeyQuery::parse("a/b/").full, None);
    }
}
