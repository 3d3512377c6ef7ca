//! The data model: namespaces, lock classes and their policies, leases, SPIFFE IDs.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, InvalidInput, Result};

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
    /// [`InvalidInput::BadSpiffeId`].
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        let ok = id.len() <= 2048
            && id
                .strip_prefix("spiffe://")
                .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
            && !id.chars().any(|c| c.is_whitespace() || c.is_control());
        if ok {
            Ok(SpiffeId(id))
        } else {
            Err(Error::invalid(InvalidInput::BadSpiffeId(id)))
        }
    }

    /// The ID as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How a lock is held.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One holder at a time (X).
    Exclusive,
    /// Many holders at once while no exclusive holder or earlier exclusive waiter
    /// exists (S).
    Shared,
}

impl Mode {
    /// The key segment: `x` or `s`.
    pub(crate) fn segment(self) -> &'static str {
        match self {
            Mode::Exclusive => "x",
            Mode::Shared => "s",
        }
    }
}

/// Whether resources must refuse writes without a valid token.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Resources refuse missing or stale tokens.
    Fenced,
    /// Resources admit missing or stale tokens and record them as unprotected.
    Advisory,
}

/// What acquire does when etcd cannot commit (no leader, timeouts).
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuorumPolicy {
    /// Fail with [`ErrorKind::QuorumLost`](crate::ErrorKind::QuorumLost).
    Closed,
    /// Hand back an unprotected grant: a [`Hold`](crate::Hold) without a token.
    Open,
}

/// A namespace: the unit of tenancy, quotas and authorization.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// Name, `[a-z0-9][a-z0-9_-]{0,62}`.
    pub id: String,
    /// Owning tenant.
    pub tenant_id: String,
    /// Most holds that may be live at once in the namespace (enforced by the service).
    pub held_lease_quota: u32,
    /// Most lock operations per second (enforced by the service).
    pub op_rate_quota: u32,
    /// Which etcd cluster tier serves the namespace.
    pub cluster_tier: String,
}

impl Namespace {
    /// A namespace with generous quotas and the `default` tier.
    pub fn new(id: impl Into<String>, tenant_id: impl Into<String>) -> Self {
        Namespace {
            id: id.into(),
            tenant_id: tenant_id.into(),
            held_lease_quota: 10_000,
            op_rate_quota: 1_000,
            cluster_tier: "default".into(),
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_name(&self.id)
    }
}

/// A lock class: the policy for every lock key under `key_prefix` in a namespace.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockClass {
    /// Name, `[a-z0-9][a-z0-9_-]{0,62}`.
    pub id: String,
    /// The namespace it belongs to.
    pub ns_id: String,
    /// Lock keys of this class start with this prefix. Prefixes of the classes of one
    /// namespace never overlap (neither is a prefix of the other), so a key belongs to
    /// at most one class.
    pub key_prefix: String,
    /// Shortest session TTL allowed to acquire.
    #[serde(with = "millis")]
    #[cfg_attr(feature = "service", schema(value_type = u64))]
    pub ttl_min: Duration,
    /// Longest session TTL allowed to acquire.
    #[serde(with = "millis")]
    #[cfg_attr(feature = "service", schema(value_type = u64))]
    pub ttl_max: Duration,
    /// [`Mode::Exclusive`]: only exclusive acquires. [`Mode::Shared`]: shared and
    /// exclusive acquires (a readers-writer lock).
    pub mode: Mode,
    /// Whether resources must refuse writes without a valid token.
    pub enforcement: Enforcement,
    /// What acquire does when etcd cannot commit.
    pub on_quorum_loss: QuorumPolicy,
    /// After a hold ends by expiry or force (not an orderly release), the key is not
    /// granted again until this much time has passed (as in Chubby and Consul).
    /// Default zero.
    #[serde(with = "millis", default)]
    #[cfg_attr(feature = "service", schema(value_type = u64))]
    pub lock_delay: Duration,
}

impl LockClass {
    /// An exclusive, fenced, fail-closed class with TTLs of 1 s to 60 s and no lock-delay.
    pub fn new(
        ns_id: impl Into<String>,
        id: impl Into<String>,
        key_prefix: impl Into<String>,
    ) -> Self {
        LockClass {
            id: id.into(),
            ns_id: ns_id.into(),
            key_prefix: key_prefix.into(),
            ttl_min: Duration::from_secs(1),
            ttl_max: Duration::from_secs(60),
            mode: Mode::Exclusive,
            enforcement: Enforcement::Fenced,
            on_quorum_loss: QuorumPolicy::Closed,
            lock_delay: Duration::ZERO,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_name(&self.ns_id)?;
        validate_name(&self.id)?;
        if self.ttl_min > self.ttl_max {
            return Err(Error::invalid(InvalidInput::TtlBoundsInverted {
                min: self.ttl_min,
                max: self.ttl_max,
            }));
        }
        if !self.key_prefix.is_empty() {
            crate::keys::validate_key(&self.key_prefix)?;
        }
        Ok(())
    }

    /// Whether the two classes' prefixes overlap (one is a prefix of the other).
    pub(crate) fn overlaps(&self, other: &LockClass) -> bool {
        self.key_prefix.starts_with(&other.key_prefix)
            || other.key_prefix.starts_with(&self.key_prefix)
    }

    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl < self.ttl_min || ttl > self.ttl_max {
            return Err(Error::invalid(InvalidInput::TtlOutOfBounds {
                ttl,
                min: self.ttl_min,
                max: self.ttl_max,
            }));
        }
        Ok(())
    }
}

/// Checks a namespace or class name: `[a-z0-9][a-z0-9_-]{0,62}`, so it is safe as one
/// key segment and in URLs.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(InvalidInput::BadName(name.to_owned())))
    }
}

pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["a", "orders", "n-1_x", "0"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "A", "-a", "a/b", "a.b", "a b", &"x".repeat(64)] {
            assert!(validate_name(bad).unwrap_err().is_invalid_input(), "{bad}");
        }
    }

    #[test]
    fn class_validation_and_overlap() {
        let mut c = LockClass::new("ns", "c", "orders/");
        c.ttl_min = Duration::from_secs(5);
        c.ttl_max = Duration::from_secs(4);
        assert!(matches!(
            c.validate().unwrap_err().invalid_input(),
            Some(InvalidInput::TtlBoundsInverted { .. })
        ));
        let a = LockClass::new("ns", "a", "orders/");
        let b = LockClass::new("ns", "b", "orders/eu/");
        let d = LockClass::new("ns", "d", "order");
        let e = LockClass::new("ns", "e", "users/");
        assert!(a.overlaps(&b) && b.overlaps(&a) && a.overlaps(&d));
        assert!(!a.overlaps(&e));
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains("\"ttl_min\":1000"), "{json}");
        assert_eq!(serde_json::from_str::<LockClass>(&json).unwrap(), a);
    }

    #[test]
    fn spiffe_ids_and_leases() {
        assert!(SpiffeId::new("spiffe://example.org/svc/a").is_ok());
        for bad in ["", "http://x", "spiffe://", "spiffe:///x", "spiffe://a b"] {
            assert!(SpiffeId::new(bad).unwrap_err().is_invalid_input(), "{bad}");
        }
        assert_eq!(LeaseId::new(0x2a).to_string(), "000000000000002a");
    }
}
