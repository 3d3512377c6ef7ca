//! [`EpochRecord`]: which etcd cluster serves the current epoch, and how far into its
//! revisions tokens were handed out. Stored in etcd (`config/epoch`, see
//! [`crate::keys`]) and in the lock core's durable epoch store, and shown by the
//! service's `GET /v1/epoch`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{Epoch, Revision};

/// Why an epoch was started.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpochReason {
    /// The first epoch of an empty key space.
    Bootstrap,
    /// etcd was restored from a snapshot.
    Restore,
    /// The namespace moved to another etcd cluster.
    Rehome,
}

/// One epoch record, as stored in etcd (`config/epoch`) and in the durable store.
///
/// A record stored before `reserved_rev` existed loads with `reserved_rev` equal to
/// `highest_grant_rev`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredRecord")]
pub struct EpochRecord {
    /// The epoch.
    #[cfg_attr(feature = "openapi", schema(value_type = u16))]
    pub epoch: Epoch,
    /// The etcd cluster id serving it (from response headers).
    pub cluster_id: u64,
    /// When it started, milliseconds since the Unix epoch.
    pub advanced_at_ms: u64,
    /// Why it started.
    pub reason: EpochReason,
    /// The highest grant revision known to be issued in this epoch (confirmed; durable
    /// store only, and it lags the tokens handed out by up to the reservation window;
    /// etcd's copy carries the revision etcd was at when the epoch started).
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub highest_grant_rev: Revision,
    /// The reservation: the highest grant revision a token may be minted for in this
    /// epoch without another durable write (durable store only; etcd's copy carries the
    /// same value as `highest_grant_rev`). Never below `highest_grant_rev` (the lock core's
    /// epoch rules say how it is used).
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub reserved_rev: Revision,
}

/// The stored shape of [`EpochRecord`], which also reads records written before
/// `reserved_rev` existed (a missing reservation is the confirmed revision).
#[derive(Deserialize)]
struct StoredRecord {
    epoch: Epoch,
    cluster_id: u64,
    advanced_at_ms: u64,
    reason: EpochReason,
    highest_grant_rev: Revision,
    #[serde(default)]
    reserved_rev: Option<Revision>,
}

impl From<StoredRecord> for EpochRecord {
    fn from(r: StoredRecord) -> Self {
        EpochRecord {
            epoch: r.epoch,
            cluster_id: r.cluster_id,
            advanced_at_ms: r.advanced_at_ms,
            reason: r.reason,
            highest_grant_rev: r.highest_grant_rev,
            reserved_rev: r
                .reserved_rev
                .unwrap_or(r.highest_grant_rev)
                .max(r.highest_grant_rev),
        }
    }
}

impl EpochRecord {
    /// A record of an epoch starting now at `revision` (both revisions equal).
    pub fn new(epoch: Epoch, cluster_id: u64, reason: EpochReason, revision: Revision) -> Self {
        let advanced_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        EpochRecord {
            epoch,
            cluster_id,
            advanced_at_ms,
            reason,
            highest_grant_rev: revision,
            reserved_rev: revision,
        }
    }
}
