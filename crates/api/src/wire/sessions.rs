//! `POST /v1/sessions` and `POST /v1/sessions/{session}/keepalive`.

use serde::{Deserialize, Serialize};

use crate::{Mode, Revision};

/// Opens a session: one etcd lease of `ttl_ms`, owned by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OpenSessionBody {
    /// The lease TTL in ms: a whole number of seconds, from 1000 to the service's
    /// maximum (default 1 h).
    #[cfg_attr(feature = "openapi", schema(minimum = 1000, multiple_of = 1000))]
    pub ttl_ms: u64,
    /// If given, the session counts against this namespace's `held_lease_quota` for as
    /// long as its lease lives (the caller must be granted some class of it, or
    /// administer it). Without it the session counts through its holds and waits only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub namespace: Option<String>,
    /// The etcd cluster tier to open the session on (its lease lives there). Without
    /// it: the tier of `tier_of` or of `namespace` if given, else the home tier. A
    /// session acquires only locks of namespaces on its tier. A tier other than the
    /// home tier needs a service admin, or a caller granted some namespace that lives
    /// on it (else 403 `forbidden`), as `tier_of` needs the namespace's grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub tier: Option<String>,
    /// Open the session on the tier this namespace lives on, without counting it
    /// against the namespace's quota (that is `namespace`). The caller must be granted
    /// some class of it, or administer it. Given with `tier` or `namespace`, all must
    /// name the same tier (else 409 `wrong-tier`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub tier_of: Option<String>,
}

/// An open session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionView {
    /// The session id: the lease id as 16 lower-case hex digits on the home tier,
    /// `<tier>.<16 hex digits>` on another tier
    /// ([`TieredSessionId`](crate::TieredSessionId)).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^([a-z0-9][a-z0-9_-]{0,62}[.])?[0-9a-f]{16}$")
    )]
    pub session: String,
    /// The owner.
    pub spiffe_id: String,
    /// The TTL etcd granted, in ms (can exceed the TTL asked for).
    pub ttl_ms: u64,
    /// The etcd revision at which the session was recorded.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub opened_rev: Revision,
    /// The namespace whose quota the session counts against, if any.
    pub namespace: Option<String>,
    /// The etcd cluster tier the session's lease lives on.
    #[serde(default)]
    pub tier: String,
}

/// A renewed session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeepaliveView {
    /// The TTL the lease was renewed to, in ms.
    pub ttl_ms: u64,
    /// The holds of this session that were force-released while it lived, oldest grant
    /// first: each is gone although the session lives, and its token is no longer the
    /// holder's to use.
    #[serde(default)]
    pub forced: Vec<ForcedHoldView>,
}

/// A hold of a session that a force release ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForcedHoldView {
    /// The namespace.
    pub namespace: String,
    /// The class.
    pub class: String,
    /// The lock key.
    pub key: String,
    /// The mode it was held in.
    pub mode: Mode,
    /// The revision of the Txn that granted it.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub grant_rev: Revision,
    /// The force release request that ended it.
    pub request_id: String,
}
