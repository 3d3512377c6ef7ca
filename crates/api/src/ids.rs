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
    /// Checks the shape the SPIFFE ID standard gives: `spiffe://`, a trust domain of
    /// lowercase letters, digits, `.`, `-` and `_`, then a path of segments each `/` and
    /// one or more letters, digits, `.`, `-` and `_`, none of them `.` or `..`; no query,
    /// fragment, port or user info; at most 2048 bytes. Authorization matches path
    /// prefixes on the string as given, so an ID with `..` in it, which names another
    /// path than it spells, is refused.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadSpiffeId`], naming it.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidInput> {
        let id = id.into();
        let ok = id.len() <= 2048 && id.strip_prefix("spiffe://").is_some_and(well_formed);
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

/// The part of a SPIFFE ID after `spiffe://`: a trust domain, then a path, as
/// [`SpiffeId::new`] describes.
fn well_formed(rest: &str) -> bool {
    let (domain, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let domain_ok = !domain.is_empty()
        && domain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    domain_ok && (path.is_empty() || path[1..].split('/').all(segment_ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_and_leases() {
        assert!(SpiffeId::new("spiffe://example.org/svc/a").is_ok());
        assert!(SpiffeId::new("spiffe://example.org").is_ok());
        assert!(SpiffeId::new("spiffe://td_1.x-y/Svc/a.b/c-d_E").is_ok());
        for bad in [
            "",
            "http://x",
            "spiffe://",
            "spiffe:///x",
            "spiffe://a b",
            "spiffe://example.org/ops/../orders/lead",
            "spiffe://example.org/ops/./a",
            "spiffe://example.org/ops//a",
            "spiffe://example.org/ops/",
            "spiffe://EXAMPLE.org/ops/alice",
            "spiffe://example.org:443/a",
            "spiffe://user@example.org/a",
            "spiffe://example.org/a?x=1",
            "spiffe://example.org/a#f",
            "spiffe://example.org/a%2e%2e",
            "SPIFFE://example.org/a",
        ] {
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

/// Names one acquire, so that a retry of it (sent again after a reset connection or a
/// lost answer) is told from another acquire of the same session: a retry with the same
/// id gets the same hold, or the same place in the lock's queue; another id, on a lock
/// the session holds or waits for, is refused (409 `already-held` or
/// `acquire-in-flight`). Chosen by the client, at random, once per acquire; from 1 to
/// 2^53 − 1, so that every JSON reader holds it exactly. Stored in the hold's and the
/// waiter's value (`attempt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct AttemptId(u64);

impl AttemptId {
    /// The largest id: 2^53 − 1.
    pub const MAX: u64 = (1 << 53) - 1;

    /// Checks that `id` is from 1 to [`AttemptId::MAX`].
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadAttempt`] otherwise.
    pub fn new(id: u64) -> Result<AttemptId, InvalidInput> {
        if id == 0 || id > Self::MAX {
            return Err(InvalidInput::BadAttempt(id));
        }
        Ok(AttemptId(id))
    }

    /// A fresh random id (from the operating system's random source, mixed with a
    /// counter so that two ids of one process never repeat).
    pub fn random() -> AttemptId {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut seed = [0u8; 8];
        // An OS without a random source still gets ids unique within the process.
        let _ = getrandom::fill(&mut seed);
        let mut z = u64::from_le_bytes(seed)
            ^ COUNTER
                .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
                .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        AttemptId((z & Self::MAX).max(1))
    }

    /// The id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for AttemptId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        AttemptId::new(u64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
