//! Classification: the changes of one etcd revision under the root become lock events
//! (grant, release, expiry, forced release), told apart by what else the revision did.

use std::collections::{HashMap, HashSet};

use etcd_client::{Event, EventType};

use palisade_api::keys::{HoldEnd, HoldValue, LockEntry, LockEntryKey, RecordChange, RootKeys};
use palisade_api::{LeaseId, Mode};
use palisade_fence::{Epoch, FencingToken, Revision};

use crate::{ClusterId, LockEvent, LockEventKind};

/// One key's change, as much of a watch event as the classification needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) revision: i64,
    pub(crate) delete: bool,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) version: i64,
    pub(crate) create_revision: i64,
    pub(crate) lease: i64,
    /// The value and create revision before the change (deletes carry it with `prev_kv`).
    pub(crate) prev: Option<(Vec<u8>, i64)>,
}

impl Change {
    pub(crate) fn from_event(e: &Event) -> Option<Change> {
        let kv = e.kv()?;
        Some(Change {
            revision: kv.mod_revision(),
            delete: e.event_type() == EventType::Delete,
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            version: kv.version(),
            create_revision: kv.create_revision(),
            lease: kv.lease(),
            prev: e
                .prev_kv()
                .map(|p| (p.value().to_vec(), p.create_revision())),
        })
    }
}

/// The part of a hold value the rows need.
struct Meta {
    spiffe_id: String,
    epoch: u16,
    /// Whether the grant wrote a grant record.
    grant_record: bool,
}

impl Meta {
    fn parse(value: &[u8]) -> Option<Meta> {
        let v = HoldValue::parse(value)?;
        Some(Meta {
            spiffe_id: v.spiffe_id.into_owned(),
            epoch: v.epoch,
            grant_record: v.grant_record,
        })
    }

    fn token(&self, create_revision: i64) -> Option<FencingToken> {
        let epoch = Epoch::new(self.epoch).ok()?;
        FencingToken::from_parts(epoch, Revision::from_i64(create_revision).ok()?).ok()
    }
}

/// Whether a key is a hold (`true`) or a grant record (`false`), parsed; `None` for
/// every other key.
fn hold_or_grant<'a>(keys: &RootKeys, key: &'a [u8]) -> Option<(bool, LockEntryKey<'a>)> {
    let parsed = keys.parse_lock_entry(key)?;
    match parsed.entry {
        LockEntry::Hold(..) => Some((true, parsed)),
        LockEntry::Grant(..) => Some((false, parsed)),
        _ => None,
    }
}

/// The identity of a lock entry's hold and grant record: `(ns, class, escaped key,
/// mode, lease)`.
fn grant_of<'a>(p: &LockEntryKey<'a>) -> Option<(&'a str, &'a str, &'a str, Mode, LeaseId)> {
    match p.entry {
        LockEntry::Hold(m, l) | LockEntry::Grant(m, l) => {
            Some((p.ns, p.class, p.escaped_key, m, l))
        }
        _ => None,
    }
}

/// The leases whose marker (`leases/<lease>`, or a detached session's record) `others`
/// delete, by revision: in that revision the lease ended.
pub(crate) fn lease_ends(keys: &RootKeys, others: &[Change]) -> HashSet<(i64, LeaseId)> {
    others
        .iter()
        .filter(|c| c.delete)
        .filter_map(|c| Some((c.revision, keys.ended_lease(&c.key)?)))
        .collect()
}

/// Turns lock-key changes (in etcd's order, complete revisions) into rows; `ends` are
/// the leases that ended, by revision ([`lease_ends`] of the same response's other keys).
pub(crate) fn classify(
    cluster: ClusterId,
    keys: &RootKeys,
    changes: &[Change],
    ends: &HashSet<(i64, LeaseId)>,
) -> Vec<LockEvent> {
    let mut out = Vec::new();
    for group in changes.chunk_by(|a, b| a.revision == b.revision) {
        let grant_records: HashMap<_, &Change> = group
            .iter()
            .filter_map(|c| match hold_or_grant(keys, &c.key) {
                Some((false, p)) => Some((grant_of(&p)?, c)),
                _ => None,
            })
            .collect();
        let mut seq = 0;
        for c in group {
            let Some((true, path)) = hold_or_grant(keys, &c.key) else {
                continue;
            };
            let (kind, meta) = if !c.delete {
                // Only a creation is a grant: the lock core rewrites a hold only when a
                // retry of the acquire adopts it (same create revision, same token).
                if c.version != 1 {
                    continue;
                }
                let Some(meta) = Meta::parse(&c.value) else {
                    continue;
                };
                (LockEventKind::Grant, Some((meta, c.create_revision)))
            } else {
                let meta = match &c.prev {
                    // Not holder meta: not a hold the lock core wrote.
                    Some((value, create)) => match Meta::parse(value) {
                        Some(m) => Some((m, *create)),
                        None => continue,
                    },
                    // History without the previous value: the event, without identity.
                    None => None,
                };
                let grant = grant_of(&path);
                let record = match grant.and_then(|g| grant_records.get(&g)) {
                    Some(g) if g.delete => RecordChange::Deleted,
                    Some(g) => RecordChange::Put(&g.value),
                    None => RecordChange::Untouched,
                };
                let lease_ended =
                    grant.is_some_and(|(.., lease)| ends.contains(&(c.revision, lease)));
                let had_record = meta.as_ref().map(|(m, _)| m.grant_record);
                let kind = match HoldEnd::classify(had_record, record, lease_ended) {
                    HoldEnd::Released => LockEventKind::Release,
                    HoldEnd::Expired => LockEventKind::Expire,
                    HoldEnd::Forced => LockEventKind::Force,
                };
                (kind, meta)
            };
            let Ok(rev) = Revision::from_i64(c.revision) else {
                continue;
            };
            let key = path.key();
            let mut e = LockEvent::new(cluster, rev, kind, key);
            e.seq = seq;
            e.namespace = Some(path.ns.to_owned());
            e.class = Some(path.class.to_owned());
            if let Some((meta, create)) = meta {
                e.token = meta.token(create);
                e.spiffe_id = Some(meta.spiffe_id);
            }
            out.push(e);
            seq += 1;
        }
    }
    out
}
