//! Holds as etcd's history shows them: every hold key's creation and deletion under
//! `<root>locks/` of one cluster, read with a watch from a start revision up to the revision etcd was at
//! when the read began, and turned into [`Event::EtcdHold`] entries. For a space a
//! snapshot restore made, the hold keys present at its start (the snapshot's revision)
//! are read too, and become [`Event::RestoredHold`] entries.
//!
//! How a hold ended is read by the rule the audit tailer applies,
//! `palisade_api::keys::HoldEnd::classify`: its grant record deleted with it is a
//! release; the record put as `{"forced": …}` is a force; the hold key deleted with its
//! lease's marker (`leases/<lease>` or `sessions/<lease>`), or with a grant record left
//! behind, is an expiry; a hold without a record deleted alone is a release. So the read
//! covers the whole root prefix, not only `locks/`. A forced hold also gives an
//! [`Event::EtcdForced`] naming the request of its marker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use palisade_api::keys::{self, ForcedGrant, HoldValue, LockEntry, RecordChange, RootKeys};
use palisade_api::{LeaseId, Mode};

use crate::error::ChaosError;
use crate::history::{Event, HoldEnd, LockName};

/// One revision space of etcd: the cluster between two restores.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RevisionSpace {
    pub(crate) epoch: u16,
    /// The first revision that belongs to this space (after a restore: the snapshot's + 1).
    pub(crate) from: i64,
    /// 0 for the cluster the run started with, `n` after the `n`-th restore.
    pub(crate) number: u32,
}

/// How long one read may take in all.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// One key's change.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    revision: i64,
    delete: bool,
    key: String,
    value: Vec<u8>,
    version: i64,
    create_revision: i64,
}

/// What one read returned.
#[derive(Debug)]
pub(crate) struct Read {
    /// The etcd cluster id that answered.
    pub(crate) cluster_id: u64,
    /// The keys present at the revision before the first change read (for a restored
    /// space: what the snapshot held), when asked for.
    pub(crate) initial: Vec<Change>,
    pub(crate) changes: Vec<Change>,
}

impl Read {
    /// The revision of the last change to a key under `<root>locks/`: how far the audit
    /// tailer's position must move for it to have read everything this read shows (the
    /// position moves with lock-key changes only). 0 without one.
    pub(crate) fn last_lock_revision(&self, keys: &RootKeys) -> i64 {
        let locks = keys.locks();
        self.changes
            .iter()
            .rev()
            .find(|c| c.key.starts_with(&locks))
            .map_or(0, |c| c.revision)
    }
}

/// How the read learns the revision to read up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// A linearizable read (the cluster has quorum).
    Linearizable,
    /// A serializable read of the member(s) given: for a leader whose followers are
    /// stopped, so that nothing can commit while it is read.
    Serializable,
}

/// Reads every change under `prefix` from `from` up to etcd's current revision, and with
/// `initial`, the keys under `prefix` present at revision `from - 1` as well.
pub(crate) async fn read(
    endpoints: &[String],
    prefix: &str,
    from: i64,
    head: Head,
    initial: bool,
) -> Result<Read, ChaosError> {
    tokio::time::timeout(
        READ_TIMEOUT,
        read_inner(endpoints, prefix, from, head, initial),
    )
    .await
    .map_err(|_| ChaosError::NotReady("etcd history".into()))?
}

async fn read_inner(
    endpoints: &[String],
    prefix: &str,
    from: i64,
    head: Head,
    initial: bool,
) -> Result<Read, ChaosError> {
    let mut client = Client::connect(endpoints, None)
        .await
        .map_err(ChaosError::etcd("connecting to etcd"))?;
    let mut options = GetOptions::new().with_prefix().with_count_only();
    if head == Head::Serializable {
        options = options.with_serializable();
    }
    let now = client
        .get(prefix, Some(options))
        .await
        .map_err(ChaosError::etcd("reading etcd's revision"))?;
    let header = now
        .header()
        .ok_or(ChaosError::NotReady("an etcd response header".into()))?;
    let (cluster_id, through) = (header.cluster_id(), header.revision());
    let mut start = Vec::new();
    if initial && from > 1 {
        let mut options = GetOptions::new().with_prefix().with_revision(from - 1);
        if head == Head::Serializable {
            options = options.with_serializable();
        }
        let resp = client
            .get(prefix, Some(options))
            .await
            .map_err(ChaosError::etcd("reading the keys a restore brought back"))?;
        for kv in resp.kvs() {
            start.push(Change {
                revision: kv.mod_revision(),
                delete: false,
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                version: kv.version(),
                create_revision: kv.create_revision(),
            });
        }
    }
    let mut changes = Vec::new();
    if from > through {
        return Ok(Read {
            cluster_id,
            initial: start,
            changes,
        });
    }
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let (mut watcher, mut stream) = client
        .watch(prefix, Some(options))
        .await
        .map_err(ChaosError::etcd("watching etcd's history"))?;
    loop {
        let next = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
        let Ok(message) = next else {
            // Caught up with nothing more to send: ask where the watch stands.
            watcher
                .request_progress()
                .await
                .map_err(ChaosError::etcd("asking for watch progress"))?;
            continue;
        };
        let Some(resp) = message.map_err(ChaosError::etcd("reading etcd's history"))? else {
            return Err(ChaosError::NotReady(
                "etcd's history (the watch ended)".into(),
            ));
        };
        if resp.canceled() {
            return Err(ChaosError::NotReady(format!(
                "etcd's history (watch canceled: {})",
                resp.cancel_reason()
            )));
        }
        for e in resp.events() {
            let Some(kv) = e.kv() else { continue };
            changes.push(Change {
                revision: kv.mod_revision(),
                delete: e.event_type() == EventType::Delete,
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                version: kv.version(),
                create_revision: kv.create_revision(),
            });
        }
        let last_event = changes.last().map_or(0, |c| c.revision);
        let progress = !resp.created() && resp.events().is_empty();
        let at = resp.header().map_or(0, |h| h.revision());
        if last_event >= through || (progress && at >= through) {
            let _ = watcher.cancel().await;
            changes.retain(|c| c.revision <= through);
            return Ok(Read {
                cluster_id,
                initial: start,
                changes,
            });
        }
    }
}

/// A hold or grant-record key, as the key layout's parser reads it.
struct Path {
    lock: LockName,
    hold: bool,
    mode: Mode,
    lease: LeaseId,
}

impl Path {
    /// The grant record of this hold.
    fn grant_record(&self, keys: &RootKeys) -> String {
        keys.lock(&self.lock.ns, &self.lock.class, &self.lock.key)
            .grant(self.mode, self.lease)
    }
}

fn parse(keys: &RootKeys, key: &str) -> Option<Path> {
    let p = keys.parse_lock_entry(key.as_bytes())?;
    let (hold, mode, lease) = match p.entry {
        LockEntry::Hold(m, l) => (true, m, l),
        LockEntry::Grant(m, l) => (false, m, l),
        _ => return None,
    };
    Some(Path {
        lock: LockName {
            ns: p.ns.to_owned(),
            class: p.class.to_owned(),
            key: p.key(),
        },
        hold,
        mode,
        lease,
    })
}

/// The epoch written in a hold's value; `None` when it is not holder meta.
fn hold_epoch(value: &[u8]) -> Option<u16> {
    HoldValue::parse(value).map(|v| v.epoch)
}

/// The holds of one revision space.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    /// One [`Event::EtcdHold`] per hold created in the space, and one
    /// [`Event::RestoredHold`] per hold key present at its start.
    pub(crate) holds: Vec<Event>,
    /// Hold keys deleted in the space that were neither created in it nor present at its
    /// start: the read missed part of the space (never seen on a whole read).
    pub(crate) unmatched_ends: u64,
}

/// Turns the changes of one revision space into holds. A hold carries the epoch written
/// in its value (the space's epoch when that cannot be read); holds still present at the
/// end are [`HoldEnd::Open`] (for a space a restore ended: present when it was
/// destroyed). Hold keys in `read.initial` (the space began with them: a restore brought
/// them back) become [`Event::RestoredHold`]s, ended by their delete in the space.
/// `tier` names the tier whose cluster was read (`None`: the home tier); every
/// [`Event::EtcdHold`] carries it.
pub(crate) fn holds(
    keys: &RootKeys,
    read: &Read,
    space: RevisionSpace,
    tier: Option<&str>,
) -> Holds {
    let tier = tier.map(str::to_owned);
    let epoch = space.epoch;
    let mut result = Holds::default();
    let out = &mut result.holds;
    let mut open: BTreeMap<String, (LockName, i64, bool, u16, Option<i64>)> = BTreeMap::new();
    let mut restored: BTreeMap<String, (LockName, i64, bool, u16)> = BTreeMap::new();
    // Whether each open or restored hold's grant wrote a grant record (its stored meta).
    let mut had_record: HashMap<String, bool> = HashMap::new();
    for c in &read.initial {
        let Some(path) = parse(keys, &c.key).filter(|p| p.hold) else {
            continue;
        };
        let e = hold_epoch(&c.value).unwrap_or(epoch);
        if let Some(v) = HoldValue::parse(&c.value) {
            had_record.insert(c.key.clone(), v.grant_record);
        }
        restored.insert(
            c.key.clone(),
            (
                path.lock,
                c.create_revision,
                path.mode == Mode::Exclusive,
                e,
            ),
        );
    }
    let restored_rev = space.from - 1;
    let restored_hold =
        |(lock, grant_rev, exclusive, hold_epoch): (LockName, i64, bool, u16), end_rev, end| {
            Event::RestoredHold {
                lock,
                epoch: hold_epoch,
                grant_rev,
                restored_rev,
                space: space.number,
                end_rev,
                exclusive,
                end,
            }
        };
    for group in read.changes.chunk_by(|a, b| a.revision == b.revision) {
        let grant_records: HashMap<&str, &Change> = group
            .iter()
            .filter(|c| parse(keys, &c.key).is_some_and(|p| !p.hold))
            .map(|c| (c.key.as_str(), c))
            .collect();
        let ended: HashSet<LeaseId> = group
            .iter()
            .filter(|c| c.delete)
            .filter_map(|c| keys.ended_lease(c.key.as_bytes()))
            .collect();
        for c in group {
            let Some(path) = parse(keys, &c.key).filter(|p| p.hold) else {
                continue;
            };
            let exclusive = path.mode == Mode::Exclusive;
            if !c.delete {
                if c.version == 1 {
                    let e = hold_epoch(&c.value).unwrap_or(epoch);
                    let session = Some(path.lease.get());
                    if let Some(v) = HoldValue::parse(&c.value) {
                        had_record.insert(c.key.clone(), v.grant_record);
                    }
                    open.insert(
                        c.key.clone(),
                        (path.lock, c.create_revision, exclusive, e, session),
                    );
                }
                continue;
            }
            let record = path.grant_record(keys);
            let marker = grant_records
                .get(record.as_str())
                .filter(|g| !g.delete)
                .and_then(|g| serde_json::from_slice::<ForcedGrant<'_>>(&g.value).ok());
            let change = match grant_records.get(record.as_str()) {
                Some(g) if g.delete => RecordChange::Deleted,
                Some(g) => RecordChange::Put(&g.value),
                None => RecordChange::Untouched,
            };
            let end = match keys::HoldEnd::classify(
                had_record.remove(&c.key),
                change,
                ended.contains(&path.lease),
            ) {
                keys::HoldEnd::Released => HoldEnd::Released,
                keys::HoldEnd::Expired => HoldEnd::Expired,
                keys::HoldEnd::Forced => HoldEnd::Forced,
            };
            let Some((lock, grant_rev, exclusive, hold_epoch, session)) = open.remove(&c.key)
            else {
                match restored.remove(&c.key) {
                    Some(hold) => {
                        if let Some(marker) = &marker {
                            out.push(Event::EtcdForced {
                                lock: hold.0.clone(),
                                epoch: hold.3,
                                grant_rev: hold.1,
                                end_rev: c.revision,
                                space: space.number,
                                request_id: marker.forced.request_id.clone(),
                            });
                        }
                        out.push(restored_hold(hold, Some(c.revision), end));
                    }
                    None => result.unmatched_ends += 1,
                }
                continue;
            };
            let space = space.number;
            if let Some(marker) = marker {
                out.push(Event::EtcdForced {
                    lock: lock.clone(),
                    epoch: hold_epoch,
                    grant_rev,
                    end_rev: c.revision,
                    space,
                    request_id: marker.forced.request_id.clone(),
                });
            }
            out.push(Event::EtcdHold {
                lock,
                epoch: hold_epoch,
                grant_rev,
                end_rev: Some(c.revision),
                exclusive,
                end,
                space,
                session,
                tier: tier.clone(),
            });
        }
    }
    for (_, (lock, grant_rev, exclusive, hold_epoch, session)) in open {
        let space = space.number;
        out.push(Event::EtcdHold {
            lock,
            epoch: hold_epoch,
            grant_rev,
            end_rev: None,
            exclusive,
            end: HoldEnd::Open,
            space,
            session,
            tier: tier.clone(),
        });
    }
    for (_, hold) in restored {
        out.push(restored_hold(hold, None, HoldEnd::Open));
    }
    result
}

#[cfg(test)]
mod tests;
