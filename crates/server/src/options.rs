//! [`ServiceOptions`]: how the service is built.

use std::time::Duration;

use crate::authz::Authz;
use crate::force_release::ForceReleases;

/// The default of [`ServiceOptions::with_max_sessions_per_identity`].
pub const DEFAULT_MAX_SESSIONS_PER_IDENTITY: u32 = 64;

/// How the service is built.
#[derive(Debug, Clone)]
#[must_use]
pub struct ServiceOptions {
    pub(crate) authz: Authz,
    pub(crate) dev_identity: bool,
    pub(crate) body_limit: usize,
    pub(crate) max_wait: Duration,
    pub(crate) max_ttl: Duration,
    pub(crate) force: Option<ForceReleases>,
    pub(crate) max_sessions_per_identity: u32,
    pub(crate) tiers: Option<palisade_lock::Tiers>,
    pub(crate) conn_limits: palisade_listen::ConnLimits,
}

impl ServiceOptions {
    /// Identity from the transport only; body limit 16 KiB; waits up to 60 s; TTLs up
    /// to 1 h; at most [`DEFAULT_MAX_SESSIONS_PER_IDENTITY`] open sessions per identity;
    /// the default [`ConnLimits`](palisade_listen::ConnLimits).
    pub fn new(authz: Authz) -> Self {
        ServiceOptions {
            authz,
            dev_identity: false,
            body_limit: 16 * 1024,
            max_wait: Duration::from_secs(60),
            max_ttl: palisade_api::limits::MAX_SESSION_TTL,
            force: None,
            max_sessions_per_identity: DEFAULT_MAX_SESSIONS_PER_IDENTITY,
            tiers: None,
            conn_limits: palisade_listen::ConnLimits::new(),
        }
    }

    /// INSECURE: takes the caller's identity from the [`DEV_IDENTITY_HEADER`](crate::DEV_IDENTITY_HEADER), which
    /// anyone can set. [`serve_dev`](crate::serve_dev) then binds to loopback only and warns at start.
    pub fn insecure_dev_identity(mut self) -> Self {
        self.dev_identity = true;
        self
    }

    /// The largest request body accepted, in bytes; larger bodies get 413.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// How many sessions one identity may have open at once, across every replica of
    /// the service and every tier (each session is an etcd lease, and etcd slows as
    /// leases pile up).
    /// Past it, opening a session is 429 `quota-exceeded`. At least 1.
    pub fn with_max_sessions_per_identity(mut self, max: u32) -> Self {
        self.max_sessions_per_identity = max.max(1);
        self
    }

    /// The longest `wait_ms` an acquire may ask for.
    pub fn with_max_wait(mut self, max: Duration) -> Self {
        self.max_wait = max;
        self
    }

    /// Enables two-person force release (`/v1/force-releases`); without it those routes
    /// answer 404.
    pub fn with_force_releases(mut self, force: ForceReleases) -> Self {
        self.force = Some(force);
        self
    }

    /// Serves several etcd cluster tiers: sessions open on a tier, each namespace is
    /// served by its tier's locker, and `POST /v1/namespaces/{ns}/rehome` moves one
    /// (see [`Tiers`](palisade_lock::Tiers)). The router's own locker must be the home
    /// tier's. Without it the service has one tier, [`palisade_lock::DEFAULT_TIER`].
    pub fn with_tiers(mut self, tiers: palisade_lock::Tiers) -> Self {
        self.tiers = Some(tiers);
        self
    }

    /// The listener's bounds: handshake, request head and keep-alive idle, body stall,
    /// the connection cap and its probe reserve (see
    /// [`ConnLimits`](palisade_listen::ConnLimits)). The probe paths are always
    /// [`LIVEZ`](crate::LIVEZ) and [`READYZ`](crate::READYZ): on the reserve, past the
    /// cap, only they answer.
    pub fn with_conn_limits(mut self, limits: palisade_listen::ConnLimits) -> Self {
        self.conn_limits = limits;
        self
    }

    /// The longest session TTL (default
    /// [`MAX_SESSION_TTL`](palisade_api::limits::MAX_SESSION_TTL), 1 h).
    pub fn with_max_ttl(mut self, max: Duration) -> Self {
        self.max_ttl = max;
        self
    }
}
