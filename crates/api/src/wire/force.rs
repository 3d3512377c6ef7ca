//! Force release, by two people: a request, then an approval by another admin.

use serde::{Deserialize, Serialize};

use crate::{FencingToken, Mode, Revision};

/// Requests the force release of a lock key (`POST /v1/force-releases`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForceRequestBody {
    /// The namespace.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub namespace: String,
    /// The class.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$"))]
    pub class: String,
    /// The lock key.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 512))]
    pub key: String,
    /// Why: 1 to 1024 bytes, not blank, no control character (`validate_text`).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 1024,
            pattern = r"^[^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*[^\u0000-\u0020\u007f-\u00a0\u061c\u1680\u2000-\u200a\u200e\u200f\u2028\u2029\u202a-\u202f\u205f\u2066-\u2069\u3000\ufeff][^\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$"
        )
    )]
    pub reason: String,
    /// The one hold to release, by its grant revision. Without it (and without
    /// `token`), the request is about every hold of the key at request time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub grant_rev: Option<Revision>,
    /// The one hold to release, by its token (a decimal u64 as a string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub token: Option<FencingToken>,
}

/// One hold a force release request is about, fixed when the request is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForceTargetView {
    /// The holder's session.
    pub session: String,
    /// Its mode.
    pub mode: Mode,
    /// The revision of the Txn that granted the hold.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub grant_rev: Revision,
    /// Its token, a decimal u64 as a string.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub token: FencingToken,
}

/// A force release request, not yet approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForceRequestView {
    /// The request id, to approve it with.
    pub id: String,
    /// The namespace.
    pub namespace: String,
    /// The class.
    pub class: String,
    /// The lock key.
    pub key: String,
    /// Who asked.
    pub requester: String,
    /// Why.
    pub reason: String,
    /// The holds the request is about, as found when it was made: an approval releases
    /// these and no other (a hold granted since is never touched).
    pub targets: Vec<ForceTargetView>,
}

/// One hold a force release deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleasedView {
    /// The holder's session.
    pub session: String,
    /// Its mode.
    pub mode: Mode,
    /// The deleted hold's token, a decimal u64 as a string.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub token: FencingToken,
    /// The revision of the Txn that granted the deleted hold.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub grant_rev: Revision,
    /// The revision of the Txn that deleted it.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub revision: Revision,
}

/// An approved, executed force release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApproveView {
    /// The request id.
    pub id: String,
    /// Who asked.
    pub requester: String,
    /// Who approved.
    pub approver: String,
    /// Whether the class was fenced when the holds were deleted.
    pub class_was_fenced: bool,
    /// The holds this approval deleted: those of the request's targets still held
    /// (never empty; an approval that finds every target gone answers 409
    /// `force-target-gone`). A retried approval lists again the holds an earlier attempt
    /// of the same request deleted.
    pub released: Vec<ReleasedView>,
}
