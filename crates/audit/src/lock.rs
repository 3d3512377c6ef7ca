//! Lock events (from etcd history) and forced releases: the `audit_event` and
//! `force_release` rows.

use std::fmt;
use std::time::SystemTime;

use palisade_fence::{FencingToken, Revision};
use serde::{Deserialize, Serialize};

/// An etcd cluster id (the `cluster_id` of etcd's response header). Stored in a signed
/// `BIGINT` bit for bit; shown as 16 hex digits, as `etcdctl` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusterId(pub u64);

impl ClusterId {
    /// The value stored in the database.
    pub fn to_sql(self) -> i64 {
        self.0 as i64
    }

    /// From the value stored in the database.
    pub fn from_sql(value: i64) -> Self {
        ClusterId(value as u64)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The kind of an event of a lock's history: the value of `audit_event.type`, and
/// [`Epoch`](LockEventKind::Epoch) for the epoch advances kept in `epoch_event` (see
/// [`EpochAdvance`](crate::EpochAdvance)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LockEventKind {
    /// A hold was granted; the event carries its token.
    Grant,
    /// The holder released.
    Release,
    /// The hold's lease expired (a delete that no release or force asked for).
    Expire,
    /// An operator forced the release (see [`ForceRelease`]).
    Force,
    /// etcd history was compacted past the tailer's position: events in
    /// `gap_from..=gap_to` are unknown.
    Gap,
    /// The cluster's epoch advanced (a restore, or a namespace rehomed to its tier):
    /// tokens after it carry the new epoch. Stored in `epoch_event`, never in
    /// `audit_event`, whose rows are lock events.
    Epoch,
}

impl LockEventKind {
    /// The value stored in `audit_event.type`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockEventKind::Grant => "grant",
            LockEventKind::Release => "release",
            LockEventKind::Expire => "expire",
            LockEventKind::Force => "force",
            LockEventKind::Gap => "gap",
            LockEventKind::Epoch => "epoch",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "grant" => LockEventKind::Grant,
            "release" => LockEventKind::Release,
            "expire" => LockEventKind::Expire,
            "force" => LockEventKind::Force,
            "gap" => LockEventKind::Gap,
            "epoch" => LockEventKind::Epoch,
            _ => return None,
        })
    }
}

/// One `audit_event` row. `(cluster_id, revision, seq)` is the key: inserting the same
/// event twice stores it once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LockEvent {
    /// The etcd cluster the revision belongs to.
    pub cluster_id: ClusterId,
    /// The etcd revision of the event (for a gap, its first missing revision).
    pub revision: Revision,
    /// The event's position among the events of its revision (0 for the first).
    pub seq: u32,
    /// What happened.
    pub kind: LockEventKind,
    /// The lock key (`None` only for gaps and epoch advances).
    pub lock_key: Option<String>,
    /// The lock namespace, when known.
    pub namespace: Option<String>,
    /// The lock class, when known.
    pub class: Option<String>,
    /// The holder's SPIFFE ID.
    pub spiffe_id: Option<String>,
    /// The hold's token.
    pub token: Option<FencingToken>,
    /// For gaps: the first and last revision not seen.
    pub gap: Option<(Revision, Revision)>,
    /// When the row was stored (etcd history has no timestamps); set by the database.
    pub recorded_at: Option<SystemTime>,
}

impl LockEvent {
    /// An event on `lock_key` at `revision` (seq 0; set the public fields for the rest).
    pub fn new(
        cluster_id: ClusterId,
        revision: Revision,
        kind: LockEventKind,
        lock_key: impl Into<String>,
    ) -> Self {
        LockEvent {
            cluster_id,
            revision,
            seq: 0,
            kind,
            lock_key: Some(lock_key.into()),
            namespace: None,
            class: None,
            spiffe_id: None,
            token: None,
            gap: None,
            recorded_at: None,
        }
    }

    /// A compaction gap: revisions `from..=to` could not be read.
    pub fn gap(cluster_id: ClusterId, from: Revision, to: Revision) -> Self {
        LockEvent {
            cluster_id,
            revision: from,
            seq: 0,
            kind: LockEventKind::Gap,
            lock_key: None,
            namespace: None,
            class: None,
            spiffe_id: None,
            token: None,
            gap: Some((from, to)),
            recorded_at: None,
        }
    }
}

/// One `force_release` row: who forced a release, who approved it, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ForceRelease {
    /// The request's id (unique).
    pub request_id: String,
    /// The etcd cluster of `revision`.
    pub cluster_id: ClusterId,
    /// The revision of the forced delete; joins the `force` row of `audit_event`.
    pub revision: Revision,
    /// The revision of the Txn that granted the deleted hold; `None` in rows recorded
    /// before the grant was part of the record.
    pub grant_rev: Option<Revision>,
    /// The deleted hold's token; `None` as `grant_rev`.
    pub token: Option<FencingToken>,
    /// The lock key.
    pub lock_key: String,
    /// Who asked (SPIFFE ID or user).
    pub requester: String,
    /// Who approved (never the requester).
    pub approver: String,
    /// Why, in the requester's words.
    pub reason: String,
    /// Whether the lock's class was fenced (so resources refused the old holder).
    pub class_was_fenced: bool,
    /// When the release was forced.
    pub at: SystemTime,
}

impl ForceRelease {
    /// A forced release with every field given.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        request_id: impl Into<String>,
        cluster_id: ClusterId,
        revision: Revision,
        lock_key: impl Into<String>,
        requester: impl Into<String>,
        approver: impl Into<String>,
        reason: impl Into<String>,
        class_was_fenced: bool,
        at: SystemTime,
    ) -> Self {
        ForceRelease {
            request_id: request_id.into(),
            cluster_id,
            revision,
            grant_rev: None,
            token: None,
            lock_key: lock_key.into(),
            requester: requester.into(),
            approver: approver.into(),
            reason: reason.into(),
            class_was_fenced,
            at,
        }
    }

    /// The same record, naming the grant it ended: its revision and token.
    #[must_use]
    pub fn with_grant(mut self, grant_rev: Revision, token: FencingToken) -> Self {
        self.grant_rev = Some(grant_rev);
        self.token = Some(token);
        self
    }
}

/// A reset of a resource's high-water mark, as the audit trail keeps it (table
/// `fence_reset`): who lowered which mark, from what to what, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceReset {
    /// A unique id (a UUIDv7), so a retried insert is stored once.
    pub id: uuid::Uuid,
    /// When the mark was reset.
    pub at: SystemTime,
    /// The resource key.
    pub resource: String,
    /// The mark before.
    pub old: FencingToken,
    /// The mark after (below `old`).
    pub new: FencingToken,
    /// Why, in the operator's words.
    pub reason: String,
    /// Who: the identity the resource's database verified (`palisade fence reset` records
    /// the `session_user` that `fence_reset` logged), never a name the caller typed.
    pub actor: String,
    /// The lock that guards the resource (`NAMESPACE/CLASS/KEY`) and the reset's floor (the
    /// lowest mark it could set, read from the lock service); `None` when the lock was
    /// unknown to the resetter (`--lock-unknown`), which the dashboard shows as such.
    pub lock: Option<(String, FencingToken)>,
}

impl FenceReset {
    /// A reset made now, with a fresh id.
    pub fn new(
        resource: impl Into<String>,
        old: FencingToken,
        new: FencingToken,
        reason: impl Into<String>,
        actor: impl Into<String>,
    ) -> Self {
        FenceReset {
            id: uuid::Uuid::now_v7(),
            at: SystemTime::now(),
            resource: resource.into(),
            old,
            new,
            reason: reason.into(),
            actor: actor.into(),
            lock: None,
        }
    }

    /// The same reset, checked against `lock` with floor `floor`.
    #[must_use]
    pub fn with_lock(mut self, lock: impl Into<String>, floor: FencingToken) -> Self {
        self.lock = Some((lock.into(), floor));
        self
    }
}
