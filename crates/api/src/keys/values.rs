//! The values stored under `locks/`: holder meta on waiter, hold and grant-record keys,
//! and the force marker that rewrites a grant record.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::config::Mode;
use crate::holder_meta::HolderMeta;

/// The value of a waiter, hold or grant-record key: who, for which class, in which
/// epoch. A hold's token is `epoch · 2^48 + create_revision` of its hold key.
///
/// Readers need only `spiffe_id`, `mode` and `epoch`; `class` and `attempt` read as
/// empty and 0 when absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldValue<'a> {
    /// The SPIFFE ID of the holder's session.
    #[serde(borrow)]
    pub spiffe_id: Cow<'a, str>,
    /// The class the lock was acquired under.
    #[serde(borrow, default)]
    pub class: Cow<'a, str>,
    /// The mode asked for.
    pub mode: Mode,
    /// The epoch the hold was granted in (the high 16 bits of its token).
    pub epoch: u16,
    /// Which acquire wrote it: its [`AttemptId`](crate::AttemptId), the client's or a
    /// random one. A retry of the acquire (the same attempt) adopts a hold or waiter key
    /// of its attempt; another attempt never does (see the lock core's acquire).
    #[serde(default)]
    pub attempt: u64,
    /// Which request of the attempt wrote it: random per request, so that a retry of
    /// an attempt that takes over its hold or waiter key writes a value of its own, and
    /// the cleanup of the request it took over (a compare on the whole value) leaves
    /// the key alone. 0 in values written before requests were told apart.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request: u64,
    /// What the holder attached, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_meta: Option<Cow<'a, HolderMeta>>,
    /// Whether the grant also writes a grant record (`g/<m>/<lease>`): only for a class
    /// with a lock-delay, or a session with no lease marker (see [`crate::keys`]).
    /// Stored only when `false`; absent reads as `true`, so a hold written without the
    /// field keeps the rule it was granted under.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub grant_record: bool,
}

fn yes() -> bool {
    true
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_true(v: &bool) -> bool {
    *v
}

impl<'a> HoldValue<'a> {
    /// Parses a stored value; `None` for anything that is not holder meta.
    pub fn parse(value: &'a [u8]) -> Option<HoldValue<'a>> {
        serde_json::from_slice(value).ok()
    }
}

/// Who forced a release and why. Written as [`ForcedGrant`] into the hold's grant record
/// (`g/<m>/<lease>`) in the same revision that deletes the hold, so the audit tailer can
/// tell a force from an expiry (hold deleted, grant record untouched) and from a release
/// (both deleted). Approval (a second person) is the service's business.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForceMarker {
    /// The service's id of the force-release request (joins its audit record).
    pub request_id: String,
    /// Who asked (a SPIFFE ID or a user name).
    pub requester: String,
    /// Why.
    pub reason: String,
}

/// A grant record rewritten by a force release: `{"forced": <ForceMarker>}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForcedGrant<'a> {
    /// The marker.
    pub forced: Cow<'a, ForceMarker>,
}

impl ForcedGrant<'_> {
    /// Whether a grant record's value is a force marker.
    pub fn is_forced(value: &[u8]) -> bool {
        serde_json::from_slice::<ForcedGrant<'_>>(value).is_ok()
    }
}

/// What a force release tells the session whose hold it deleted: the value of
/// `sessions/<lease>/forced/<grant_rev>`, written in the force release's Txn on the
/// session's lease. The service reads it with the session's record and reports it on
/// keepalive, and as the answer to a release of that hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForcedNotice {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's class.
    pub class: String,
    /// The lock key.
    pub key: String,
    /// The mode the hold was held in.
    pub mode: Mode,
    /// The revision of the Txn that granted the hold (its token's revision).
    pub grant_rev: u64,
    /// The force release request that ended it.
    pub request_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_values_round_trip_and_other_json_is_not_one() {
        let meta = HolderMeta::from_value(serde_json::json!({"host": "a"})).unwrap();
        let v = HoldValue {
            spiffe_id: "spiffe://t/a".into(),
            class: "c".into(),
            mode: Mode::Shared,
            epoch: 3,
            attempt: 9,
            request: 0,
            holder_meta: Some(Cow::Borrowed(&meta)),
            grant_record: true,
        };
        let bytes = serde_json::to_vec(&v).unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"spiffe_id":"spiffe://t/a","class":"c","mode":"shared","epoch":3,"attempt":9,"holder_meta":{"host":"a"}}"#
        );
        assert_eq!(HoldValue::parse(&bytes), Some(v.clone()));
        // Without a grant record the flag is stored; absent reads as a hold with one.
        let bare = HoldValue {
            grant_record: false,
            holder_meta: None,
            ..v
        };
        let bytes = serde_json::to_vec(&bare).unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"spiffe_id":"spiffe://t/a","class":"c","mode":"shared","epoch":3,"attempt":9,"grant_record":false}"#
        );
        assert_eq!(HoldValue::parse(&bytes), Some(bare.clone()));
        // A request id is stored when set, and read back.
        let retried = HoldValue { request: 7, ..bare };
        let bytes = serde_json::to_vec(&retried).unwrap();
        assert!(std::str::from_utf8(&bytes)
            .unwrap()
            .contains(r#""attempt":9,"request":7,"#));
        assert_eq!(HoldValue::parse(&bytes), Some(retried));
        assert_eq!(HoldValue::parse(br#"{"forced":{}}"#), None);
        assert_eq!(HoldValue::parse(b""), None);
    }

    #[test]
    fn a_force_marker_is_told_from_holder_meta() {
        let m = ForceMarker {
            request_id: "r".into(),
            requester: "spiffe://t/ops".into(),
            reason: "stuck".into(),
        };
        let bytes = serde_json::to_vec(&ForcedGrant {
            forced: Cow::Borrowed(&m),
        })
        .unwrap();
        assert!(ForcedGrant::is_forced(&bytes));
        assert!(!ForcedGrant::is_forced(
            br#"{"spiffe_id":"s","mode":"exclusive","epoch":0}"#
        ));
    }
}
