//! Identifiers: etcd lease ids (a session's id) and SPIFFE IDs (who acts).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InvalidInput;

/// An etcd lease id. Every session owns exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(i64);

impl LeaseId {
    /// Wraps etcd's lease id.
    pub const fn new(id: i64) -> Self {
        LeaseId(id)
    }

    /// etcd's representation.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// Parses [`LeaseId`]'s `Display` form, exactly 16 lower-case hex digits (a session
    /// id on the wire, the `<lease>` segment of a key). `None` for anything else: another
    /// length, an upper-case or non-hex digit, a sign, or an id that is not a positive
    /// `i64` (etcd's lease ids are positive).
    pub fn from_hex(s: &str) -> Option<LeaseId> {
        if s.len() != 16 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let v = i64::try_from(u64::from_str_radix(s, 16).ok()?).ok()?;
        (v > 0).then_some(LeaseId(v))
    }
}

impl fmt::Display for LeaseId {
    /// 16 lower-case hex digits, as used in keys (the form `etcdctl lease list` prints,
    /// zero-padded).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The SPIFFE ID a session acts for (`spiffe://trust-domain/path`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SpiffeId(String);

impl SpiffeId {
    /// Checks the shape: `spiffe://`, a non-empty trust domain, no whitespace or control
    /// characters, at most 2048 bytes (the SPIFFE ID standard's limit).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadSpiffeId`], naming it.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidInput> {
        let id = id.into();
        let ok = id.len() <= 2048
            && id
                .strip_prefix("spiffe://")
                .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
            && !id.chars().any(|c| c.is_whitespace() || c.is_control());
        if ok {
            Ok(SpiffeId(id))
        } else {
            Err(InvalidInput::BadSpiffeId(id))
        }
    }

    /// The ID as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_and_leases() {
        assert!(SpiffeId::new("spiffe://example.org/svc/a").is_ok());
        for bad in ["", "http://x", "spiffe://", "spiffe:///x", "spiffe://a b"] {
            assert_eq!(
                SpiffeId::new(bad),
                Err(InvalidInput::BadSpiffeId(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(LeaseId::new(0x2a).to_string(), "000000000000002a");
    }

    #[test]
    fn lease_ids_parse_from_their_display_form_only() {
        let l = LeaseId::new(0x3211a22c6da3b70c);
        assert_eq!(LeaseId::from_hex(&l.to_string()), Some(l));
        for bad in [
            "",
            "2a",
            "000000000000002a0",
            "ffffffffffffffff",
            "0000000000000000",
            "00000000000000zz",
        ] {
            assert_eq!(LeaseId::from_hex(bad), None, "{bad}");
        }
    }
}
