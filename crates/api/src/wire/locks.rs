//! Acquire, release and status.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{AttemptId, Enforcement, FencingToken, LockClass, Mode, Revision};

/// Acquires a lock for a session, waiting up to `wait_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The session id, 16 lower-case hex digits.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{16}$"))]
    pub session: String,
    /// The namespace, `[a-z0-9][a-z0-9_-]{0,62}`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub namespace: String,
    /// The class within the namespace.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub class: String,
    /// The lock key: 1 to 512 bytes, starting with the class's key prefix; no control
    /// character, no bidirectional formatting character, no `..` segment
    /// (`validate_key`).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 512))]
    pub key: String,
    /// `exclusive` or `shared`.
    pub mode: Mode,
    /// How long to wait for the lock at most, in ms, from 0 to the service's maximum
    /// (default 60 s). `0` tries once: granted if nothing blocks the lock, else 409
    /// `deadline-exceeded` at once. The wait bounds only the waiting, never the
    /// service's own etcd calls.
    pub wait_ms: u64,
    /// A JSON object stored with the hold and listed by status, at most 1024 bytes as
    /// compact JSON (`MAX_HOLDER_META_LEN`); larger: 400 `invalid-input`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub holder_meta: Option<Map<String, Value>>,
    /// Names this acquire (1 to 2^53 − 1, chosen at random by the client once per
    /// acquire), so that sending it again after a reset connection or a lost answer is
    /// a retry: the retry gets the hold this acquire was granted, or takes over its
    /// place in the queue. Without it the service picks one, and the request cannot be
    /// retried as the same acquire. An acquire of a lock that the session holds or
    /// waits for under another attempt is 409 `already-held` or `acquire-in-flight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, minimum = 1, maximum = 9007199254740991_u64))]
    pub attempt: Option<AttemptId>,
    /// The `grant_rev` of an earlier hold of this session on this lock that its holder
    /// let go of although its release's outcome is unknown (the release's answer was
    /// lost): this acquire ends that hold, with its quota slot, and goes on. Only the
    /// hold named is ended; any other hold of the session on the lock is 409
    /// `already-held`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub replaces: Option<Revision>,
}

/// A granted hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HoldView {
    /// The holder's session.
    pub session: String,
    /// The namespace.
    pub namespace: String,
    /// The class.
    pub class: String,
    /// The lock key.
    pub key: String,
    /// The mode granted.
    pub mode: Mode,
    /// The fencing token, a decimal u64 as a string; `null` for an unprotected grant
    /// (open class, etcd unavailable).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub token: Option<FencingToken>,
    /// The revision of the granting Txn; `null` for an unprotected grant.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub grant_rev: Option<Revision>,
    /// The class's enforcement.
    pub enforcement: Enforcement,
}

/// Releases one hold, named as the acquire answer named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The holder's session.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{16}$"))]
    pub session: String,
    /// The namespace.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub namespace: String,
    /// The class.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub class: String,
    /// The lock key.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 512))]
    pub key: String,
    /// The mode held.
    pub mode: Mode,
    /// The `grant_rev` of the acquire answer.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub grant_rev: Revision,
}

/// Names one lock (the query of `GET /v1/locks/status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// The namespace.
    #[cfg_attr(feature = "openapi", param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub namespace: String,
    /// The class.
    #[cfg_attr(feature = "openapi", param(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub class: String,
    /// The lock key.
    #[cfg_attr(feature = "openapi", param(min_length = 1, max_length = 512))]
    pub key: String,
}

/// One holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HolderView {
    /// The holder's session.
    pub session: String,
    /// The mode held.
    pub mode: Mode,
    /// The revision of the granting Txn.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub grant_rev: Revision,
    /// The fencing token, a decimal u64 as a string.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub token: FencingToken,
    /// The holder's SPIFFE ID.
    pub spiffe_id: String,
    /// What the holder attached at acquire; `null` if nothing.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub holder_meta: Option<Map<String, Value>>,
}

/// One waiter of a lock, in queue order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaiterView {
    /// The waiter's session.
    pub session: String,
    /// The mode asked for.
    pub mode: Mode,
    /// The create revision of its waiter key (its place in the queue).
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub create_rev: Revision,
    /// The waiter's SPIFFE ID.
    pub spiffe_id: String,
    /// What the waiter attached at acquire; `null` if nothing.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub holder_meta: Option<Map<String, Value>>,
}

/// A lock at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StatusView {
    /// The etcd revision the state was read at.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub revision: Revision,
    /// The lock's class.
    pub class: LockClass,
    /// The holders, oldest grant first.
    pub holders: Vec<HolderView>,
    /// Waiters, first in line first.
    pub waiters: Vec<WaiterView>,
    /// Keys under the lock that no live session owns, so neither holders nor waiters:
    /// holds and waiters not on the lease their key names (no lease at all, as
    /// `etcdctl make-mirror` copies keys), or keys of another shape in the lock's
    /// ranges. The next acquire of the lock deletes the holds and waiters among them.
    /// Empty (or absent, from an older service) when there are none.
    #[serde(default)]
    pub foreign_keys: Vec<ForeignKeyView>,
}

/// A key in etcd that no live session owns (see [`StatusView::foreign_keys`] and
/// [`RehomeView::removed_keys`](crate::wire::RehomeView::removed_keys)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForeignKeyView {
    /// The etcd key, in full (root prefix included).
    pub key: String,
    /// The etcd lease the key is on, 16 lower-case hex digits (as `etcdctl lease list`
    /// prints it, zero-padded): `0000000000000000` for none.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{16}$"))]
    pub lease: String,
}
