//! The lock service: an HTTP/JSON API under `/v1` in front of a [`Locker`].
//!
//! The service keeps no state of its own, so any number of replicas can serve one etcd
//! cluster behind a load balancer. A lock session is an etcd lease: its id (16 hex
//! digits) is the lease id, its owner is recorded in etcd next to it
//! ([`SessionRecord`](palisade_lock::SessionRecord)), a keepalive is one lease renewal by
//! whichever replica receives it, and a release names the hold by
//! `(lock, session, mode, grant_rev)`, all of which the acquire response returns.
//!
//! | module | what |
//! |---|---|
//! | `routes` | the routes (each declared once, with its OpenAPI operation), and the errors they answer |
//! | `identity` | who the caller is: mTLS SPIFFE IDs, or the dev header |
//! | `authz` | what a caller may do: [`Authz`], reloadable TOML |
//! | `rate` | the namespace quotas: `held_lease_quota` slots and the `op_rate_quota` bucket |
//! | `force_release` | force release by two people, and its audit |
//! | `tls` | the mTLS acceptor ([`serve_tls`]) |
//! | `serve` | plain HTTP in dev mode ([`serve_dev`]), graceful shutdown ([`serve_dev_until`], [`serve_tls_until`]); both through `palisade_listen`, within [`ConnLimits`] ([`ServiceOptions::with_conn_limits`]) |
//! | `health` | `/livez` and `/readyz` ([`not_ready`]), answered without a caller identity |
//! | `metrics`, `openapi`, `problem` | Prometheus metrics, the OpenAPI document, problem responses |
//! | [`testing`] | feature `testing`: a running service on real etcd, for tests and benchmarks |
//!
//! The wire bodies, routes and problem kinds are defined in `palisade-api`; every etcd
//! call goes through `palisade-lock`.
//!
//! # Known limits
//!
//! - A class update reaches every replica through its locker's watch on the config
//!   prefix (usually within milliseconds); an acquire that read the class just before
//!   the update may still be granted under the old class.
//! - One session acquiring the same lock twice at once through two replicas waits behind
//!   itself until its deadline (the per-session check is per process).
//! - An acquire whose response is lost (client gone after the grant) leaves the hold
//!   until the session is closed or expires.

mod authz;
mod force_release;
mod health;
mod identity;
mod metrics;
mod openapi;
mod options;
mod problem;
mod rate;
mod routes;
mod serve;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

use axum::Router;

pub use authz::{Authz, AuthzConfig, AuthzError, Grant, NamespaceRules};
pub use force_release::{
    ForceDbError, ForceReleaseAudit, ForceReleases, ForcedRelease, FORCE_RELEASE_MIGRATION,
};
pub use health::{not_ready, LIVEZ, READYZ, READY_TIMEOUT};
pub use identity::{PeerIdentity, DEV_IDENTITY_HEADER};
pub use options::{ServiceOptions, DEFAULT_MAX_SESSIONS_PER_IDENTITY};
pub use palisade_api::ProblemKind;
pub use palisade_listen::ConnLimits;
pub use problem::Problem;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use routes::fuzzing::{parse_body, BodyRoute};
pub use serve::{serve_dev, serve_dev_until, ServeError};
pub use tls::{serve_tls, serve_tls_until, server_config, spiffe_id_of, TlsConfigError};

use palisade_lock::Locker;

/// The `/v1` router over `locker`.
pub fn router(locker: Locker, options: ServiceOptions) -> Router {
    routes::router(locker, options, serve::Stopping::never())
}

/// Every route the router serves, as `(method, path)` with path parameters in braces
/// (`/v1/sessions/{session}`), sorted by path. Router and OpenAPI document are built
/// from one declaration per route, so `GET /v1/openapi.json` documents exactly these.
pub fn routes() -> Vec<(axum::http::Method, String)> {
    routes::routes()
}

/// The OpenAPI 3.1 document of every route, as served at `GET /v1/openapi.json`.
pub fn openapi_json() -> String {
    routes::openapi().to_json().unwrap_or_default()
}
