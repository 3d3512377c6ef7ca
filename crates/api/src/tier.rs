//! Cluster tiers: [`RehomeRecord`], a rehome of one namespace in progress (stored on the
//! home tier, `tier/rehome/<ns>`, see [`crate::keys`]), and the session id form that
//! names a session's tier ([`TieredSessionId`]).

use serde::{Deserialize, Serialize};

use crate::names::validate_name;
use crate::{Epoch, InvalidInput, LeaseId};

/// How far a rehome got. The switch of the namespace's record on the home tier is the
/// commit point: before it the namespace lives on `from`, after it on `to`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RehomePhase {
    /// `from` is fenced (grants nothing in the namespace); its holds and waiters are
    /// being waited out, then the classes are copied and `to`'s epoch is advanced.
    Draining,
    /// The home tier's namespace record names `to`; `to`'s fence is being lifted.
    Switched,
}

/// A rehome of one namespace in progress, stored on the home tier at
/// `tier/rehome/<ns>`. One at a time per namespace: it is created with a Txn that
/// compares its absence, and deleted when the rehome ends or is rolled back.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RehomeRecord {
    /// The namespace.
    pub ns: String,
    /// The tier it lived on when the rehome began.
    pub from: String,
    /// The tier it moves to.
    pub to: String,
    /// How far it got.
    pub phase: RehomePhase,
    /// When it began, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// The epoch `to` serves the namespace under (set at the switch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u16>))]
    pub epoch: Option<Epoch>,
}

/// A session id as the service writes it: the lease id as 16 lower-case hex digits for
/// a session on the home tier, `<tier>.<16 hex digits>` for one on another tier (a
/// lease lives in one etcd cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieredSessionId {
    /// The tier, `None` for the home tier.
    pub tier: Option<String>,
    /// The lease.
    pub lease: LeaseId,
}

impl TieredSessionId {
    /// Reads `[<tier>.]<16 hex digits>`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadSessionId`] for anything else (a tier that is not a name,
    /// or a lease that is not 16 lower-case hex digits);
    /// [`InvalidInput::UnknownSession`] for 16 hex digits no etcd lease id can be
    /// (zero, or above `i64::MAX`).
    pub fn parse(s: &str) -> Result<TieredSessionId, InvalidInput> {
        let (tier, lease) = match s.rsplit_once('.') {
            Some((tier, lease)) => (Some(tier), lease),
            None => (None, s),
        };
        if let Some(t) = tier {
            validate_name(t).map_err(|_| InvalidInput::BadSessionId)?;
        }
        let well_formed = lease.len() == 16
            && lease
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let lease = LeaseId::from_hex(lease).ok_or_else(|| {
            if well_formed {
                InvalidInput::UnknownSession(s.to_owned())
            } else {
                InvalidInput::BadSessionId
            }
        })?;
        Ok(TieredSessionId {
            tier: tier.map(str::to_owned),
            lease,
        })
    }
}

impl std::fmt::Display for TieredSessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tier {
            Some(t) => write!(f, "{t}.{}", self.lease),
            None => write!(f, "{}", self.lease),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_name_their_tier_or_none() {
        let home = TieredSessionId::parse("00000000000000ff").unwrap();
        assert_eq!(home.tier, None);
        assert_eq!(home.to_string(), "00000000000000ff");
        let east = TieredSessionId::parse("east.00000000000000ff").unwrap();
        assert_eq!(east.tier.as_deref(), Some("east"));
        assert_eq!(east.lease, home.lease);
        assert_eq!(east.to_string(), "east.00000000000000ff");
        for bad in [
            "",
            "east.",
            ".00000000000000ff",
            "East.00000000000000ff",
            "ff",
            "a.b.00000000000000ff",
        ] {
            assert_eq!(
                TieredSessionId::parse(bad),
                Err(InvalidInput::BadSessionId),
                "{bad}"
            );
        }
        // Well formed, but no etcd lease has it.
        for none in ["0000000000000000", "east.ffffffffffffffff"] {
            assert_eq!(
                TieredSessionId::parse(none),
                Err(InvalidInput::UnknownSession(none.to_owned())),
            );
        }
    }
}
