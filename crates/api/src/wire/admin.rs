//! The admin routes: namespaces, classes, the epoch.

use serde::{Deserialize, Serialize};

use crate::{Enforcement, Mode, QuorumPolicy};

/// Creates or updates a namespace (`PUT /v1/namespaces/{ns}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NamespaceBody {
    /// The owning tenant: 1 to 256 bytes, not blank, no control character
    /// (`validate_text`).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 256,
            pattern = r"^[^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*[^\u0000-\u0020\u007f-\u00a0\u061c\u1680\u2000-\u200a\u200e\u200f\u2028\u2029\u202a-\u202f\u205f\u2066-\u2069\u3000\ufeff][^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$"
        )
    )]
    pub tenant_id: String,
    /// Default 10,000; at most 2^32 - 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<u64>, maximum = 4294967295_u64)
    )]
    pub held_lease_quota: Option<u32>,
    /// Operations per second; default 1,000; at most 2^32 - 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<u64>, maximum = 4294967295_u64)
    )]
    pub op_rate_quota: Option<u32>,
    /// Default `default`; 1 to 256 bytes, not blank, no control character
    /// (`validate_text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 256,
            pattern = r"^[^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*[^\u0000-\u0020\u007f-\u00a0\u061c\u1680\u2000-\u200a\u200e\u200f\u2028\u2029\u202a-\u202f\u205f\u2066-\u2069\u3000\ufeff][^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$"
        )
    )]
    pub cluster_tier: Option<String>,
}

/// Creates or updates a class (`PUT /v1/namespaces/{ns}/classes/{class}`); what is left
/// out takes [`LockClass::new`](crate::LockClass::new)'s default.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClassBody {
    /// Default `""` (every key).
    #[serde(default)]
    pub key_prefix: String,
    /// Shortest session TTL, in ms; at most 3600000
    /// ([`MAX_CLASS_TTL`](crate::limits::MAX_CLASS_TTL)).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 3600000))]
    pub ttl_min_ms: Option<u64>,
    /// Longest session TTL, in ms; at most 3600000
    /// ([`MAX_CLASS_TTL`](crate::limits::MAX_CLASS_TTL)).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 3600000))]
    pub ttl_max_ms: Option<u64>,
    /// `exclusive` (default) or `shared`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// `fenced` (default) or `advisory`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<Enforcement>,
    /// `closed` (default) or `open`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_quorum_loss: Option<QuorumPolicy>,
    /// Lock-delay after an expiry or force, in ms; default 0, at most 3600000
    /// ([`MAX_LOCK_DELAY`](crate::limits::MAX_LOCK_DELAY)).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 3600000))]
    pub lock_delay_ms: Option<u64>,
}

/// Why the epoch is advanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AdvanceReason {
    /// etcd was restored from a snapshot.
    Restore,
    /// The key space moved to another etcd cluster.
    Rehome,
}

/// Advances the epoch (`POST /v1/epoch/advance`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AdvanceBody {
    /// Why.
    pub reason: AdvanceReason,
    /// The tier whose epoch advances; the home tier if absent. The new epoch is above
    /// every epoch of every tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub tier: Option<String>,
}

/// Names the tier whose epoch record `GET /v1/epoch` shows (each tier keeps its own).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct EpochQuery {
    /// The tier; the home tier if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub tier: Option<String>,
}

/// Moves a namespace to another etcd cluster tier (`POST /v1/namespaces/{ns}/rehome`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RehomeBody {
    /// The tier to move it to.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub to: String,
    /// How long to wait for the namespace's holds and waiters on the old tier to end,
    /// in ms (default 30000, at most 600000). Past it the rehome is rolled back and
    /// answers 503 `namespace-moving`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 600000))]
    pub drain_ms: Option<u64>,
}

/// A finished rehome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RehomeView {
    /// The namespace.
    pub namespace: String,
    /// The tier it left.
    pub from: String,
    /// The tier it lives on now.
    pub to: String,
    /// The epoch record `to` serves it under: above every epoch of every tier.
    pub epoch: crate::EpochRecord,
    /// The namespace's keys on `to` that no live session owned (holds, waiters and cancel
    /// markers not on the lease they name, quota slots on no lease: what a copy of the
    /// key space without leases leaves), deleted before `to` granted in the namespace.
    /// Empty (or absent, from an older service) when there were none.
    #[serde(default)]
    pub removed_keys: Vec<crate::wire::ForeignKeyView>,
}
