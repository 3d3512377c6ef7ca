//! The configuration records: namespaces, lock classes and their policies.
//!
//! Stored as JSON under `config/` (see [`crate::keys`]) and sent as JSON by the
//! service's admin routes. Durations are whole milliseconds on the wire.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::names::{validate_key, validate_name};
use crate::text::{validate_text, MAX_LABEL_LEN};
use crate::InvalidInput;

/// How a lock is held.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// The key segment: `x` or `s` (see [`crate::keys`]).
    pub fn segment(self) -> &'static str {
        match self {
            Mode::Exclusive => "x",
            Mode::Shared => "s",
        }
    }
}

/// Whether resources must refuse writes without a valid token.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Resources refuse missing or stale tokens.
    Fenced,
    /// Resources admit missing or stale tokens and record them as unprotected.
    Advisory,
}

/// What acquire does when etcd cannot commit (no leader, timeouts).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuorumPolicy {
    /// Fail acquire with a quorum-lost error (the service's `quorum-lost` problem).
    Closed,
    /// Hand back an unprotected grant: a hold without a token.
    Open,
}

/// A namespace: the unit of tenancy, quotas and authorization.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// Name, `[a-z0-9][a-z0-9_-]{0,62}`.
    pub id: String,
    /// Owning tenant.
    pub tenant_id: String,
    /// Most holds that may be live at once in the namespace (enforced by the service).
    #[cfg_attr(feature = "openapi", schema(value_type = u64, maximum = 4294967295_u64))]
    pub held_lease_quota: u32,
    /// Most lock operations per second (enforced by the service).
    #[cfg_attr(feature = "openapi", schema(value_type = u64, maximum = 4294967295_u64))]
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

    /// Checks the name, and `tenant_id` and `cluster_tier` as text of 1 to
    /// [`MAX_LABEL_LEN`] bytes ([`validate_text`]).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadName`]; [`InvalidInput::BadText`] naming `tenant_id` or
    /// `cluster_tier`.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate_name(&self.id)?;
        validate_text("tenant_id", &self.tenant_id, MAX_LABEL_LEN)?;
        validate_text("cluster_tier", &self.cluster_tier, MAX_LABEL_LEN)
    }
}

/// A lock class: the policy for every lock key under `key_prefix` in a namespace.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub ttl_min: Duration,
    /// Longest session TTL allowed to acquire.
    #[serde(with = "millis")]
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
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

    /// Checks the names, the TTL bounds (`ttl_max` and `lock_delay` within
    /// [`limits`](crate::limits)) and the key prefix (a valid lock key, or empty).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadName`], [`InvalidInput::OutOfRange`],
    /// [`InvalidInput::TtlBoundsInverted`], or what
    /// [`validate_key`] says of the prefix.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate_name(&self.ns_id)?;
        validate_name(&self.id)?;
        crate::limits::check_class_ms("ttl_max_ms", self.ttl_max, crate::limits::MAX_CLASS_TTL)?;
        crate::limits::check_class_ms(
            "lock_delay_ms",
            self.lock_delay,
            crate::limits::MAX_LOCK_DELAY,
        )?;
        if self.ttl_min > self.ttl_max {
            return Err(InvalidInput::TtlBoundsInverted {
                min: self.ttl_min,
                max: self.ttl_max,
            });
        }
        if !self.key_prefix.is_empty() {
            validate_key(&self.key_prefix)?;
        }
        Ok(())
    }

    /// Whether the two classes' prefixes overlap (one is a prefix of the other).
    pub fn overlaps(&self, other: &LockClass) -> bool {
        self.key_prefix.starts_with(&other.key_prefix)
            || other.key_prefix.starts_with(&self.key_prefix)
    }

    /// Checks that `key` is one of this class's keys: it starts with `key_prefix`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::KeyOutsideClass`], naming the prefix.
    pub fn check_key(&self, key: &str) -> Result<(), InvalidInput> {
        if key.starts_with(&self.key_prefix) {
            Ok(())
        } else {
            Err(InvalidInput::KeyOutsideClass {
                prefix: self.key_prefix.clone(),
            })
        }
    }

    /// Checks a session TTL against the class's bounds.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::TtlOutOfBounds`].
    pub fn check_ttl(&self, ttl: Duration) -> Result<(), InvalidInput> {
        if ttl < self.ttl_min || ttl > self.ttl_max {
            return Err(InvalidInput::TtlOutOfBounds {
                ttl,
                min: self.ttl_min,
                max: self.ttl_max,
            });
        }
        Ok(())
    }
}

/// Serde for a [`Duration`] as whole milliseconds (saturating at `u64::MAX`).
pub mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes whole milliseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads whole milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_labels_are_checked_text() {
        assert_eq!(Namespace::new("ns", "acme").validate(), Ok(()));
        let bad = |tenant: &str, tier: &str| {
            let mut n = Namespace::new("ns", tenant);
            n.cluster_tier = tier.to_owned();
            n.validate().unwrap_err()
        };
        assert!(matches!(
            bad("ac\0me", "default"),
            InvalidInput::BadText {
                field: "tenant_id",
                fault: crate::TextFault::ControlCharacter { ch: '\0', at: 2 }
            }
        ));
        assert!(matches!(
            bad("", "default"),
            InvalidInput::BadText {
                field: "tenant_id",
                fault: crate::TextFault::Empty
            }
        ));
        assert!(matches!(
            bad("acme", "t\n"),
            InvalidInput::BadText {
                field: "cluster_tier",
                ..
            }
        ));
        assert!(matches!(
            bad("acme", &"t".repeat(MAX_LABEL_LEN + 1)),
            InvalidInput::BadText {
                field: "cluster_tier",
                fault: crate::TextFault::TooLong { .. }
            }
        ));
    }

    #[test]
    fn class_validation_and_overlap() {
        let mut c = LockClass::new("ns", "c", "orders/");
        c.ttl_min = Duration::from_secs(5);
        c.ttl_max = Duration::from_secs(4);
        assert!(matches!(
            c.validate(),
            Err(InvalidInput::TtlBoundsInverted { .. })
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
}
