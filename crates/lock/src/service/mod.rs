//! The lock service: an HTTP/JSON API under `/v1` in front of a [`Locker`] (feature
//! `service`).
//!
//! The service keeps no state of its own, so any number of replicas can serve one etcd
//! cluster behind a load balancer. A lock session is an etcd lease: its id (16 hex
//! digits) is the lease id, its owner is recorded in etcd next to it
//! ([`SessionRecord`](crate::SessionRecord)), a keepalive is one lease renewal by
//! whichever replica receives it, and a release names the hold by
//! `(lock, session, mode, grant_rev)`, all of which the acquire response returns.
//!
//! # Routes
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `POST /v1/sessions` | `{"ttl_ms","namespace"?}` | 201 `{"session","spiffe_id","ttl_ms","opened_rev","namespace"}` |
//! | `POST /v1/sessions/{session}/keepalive` | none | 200 `{"ttl_ms"}` |
//! | `DELETE /v1/sessions/{session}` | none | 204; every hold of the session ends |
//! | `POST /v1/locks/acquire` | `{"session","namespace","class","key","mode","wait_ms","holder_meta"?}` | 200 `{"token","grant_rev",...}` |
//! | `POST /v1/locks/release` | `{"session","namespace","class","key","mode","grant_rev"}` | 204 |
//! | `GET /v1/locks/status?namespace=&class=&key=` | none | 200 holders (with tokens and `holder_meta`), waiters in order, class |
//! | `GET /v1/namespaces` | none | 200 list |
//! | `PUT /v1/namespaces/{ns}` | `{"tenant_id",...}` | 200, create or update |
//! | `GET /v1/namespaces/{ns}/classes` | none | 200 list |
//! | `PUT /v1/namespaces/{ns}/classes/{class}` | `{"key_prefix","ttl_min_ms",...}` | 200, create or update |
//! | `GET /v1/epoch` | none | 200 the epoch record, and why grants are refused if they are |
//! | `POST /v1/epoch/advance` | `{"reason":"restore"\|"rehome"}` | 200 the new record |
//! | `GET /v1/openapi.json` | none | 200 the OpenAPI 3.1 document of every route here, with the problem responses of each (no identity needed) |
//! | `GET /metrics` | none | 200 Prometheus text: grants, acquire wait time, timeouts, releases, lost holds, quota rejections, etcd errors, expiries (no identity needed) |
//! | `POST /v1/force-releases` | `{"namespace","class","key","reason"}` | 201 `{"id",...}`: a request, nothing deleted yet |
//! | `POST /v1/force-releases/{id}/approve` | none | 200 `{"id","requester","approver","class_was_fenced","released":[{"session","mode","token","revision"}]}` |
//!
//! `holder_meta` is an optional JSON object stored with the hold (and its waiter key)
//! and listed by status for each holder and waiter, at most
//! [`MAX_HOLDER_META_LEN`](crate::MAX_HOLDER_META_LEN) (1024) bytes as compact JSON;
//! larger is 400 `invalid-input`, anything but an object 422.
//!
//! Tokens are JSON strings (decimal u64). `ttl_ms` is a whole number of seconds in ms,
//! from 1,000 to [`ServiceOptions::with_max_ttl`] (default 1 h); `wait_ms` is 1 to
//! [`ServiceOptions::with_max_wait`] (default 60 s): acquire long-polls that long at most.
//!
//! Every request runs in a `tower-http` trace span (method, path, status, latency), and
//! every etcd call attempt it makes in a child span `etcd` (`op`, `attempt`, `outcome`;
//! see the shared retry policy).
//!
//! The router is built from one route table ([`routes()`](fn@routes)); the OpenAPI document
//! ([`openapi_json`]) is generated (utoipa) from the handlers and their request and
//! response types, so its schemas say what the handlers accept: unknown fields are
//! refused (`additionalProperties: false`), names, session ids and key lengths have
//! their patterns and bounds. What a schema cannot say (the service's configured TTL and
//! wait maxima, `ttl_ms` in whole seconds) is in the field descriptions.
//!
//! # Errors
//!
//! Every error is `application/problem+json` (RFC 9457) with a stable `type`
//! `urn:palisade:problem:<slug>`; see [`ProblemKind`] for slugs and status codes. Bad
//! input (malformed JSON or not UTF-8, unknown fields, wrong types, negative or huge
//! TTLs, bad names or keys, bodies over the limit: 413) is refused with a 4xx before
//! anything is written to etcd.
//!
//! # Identity and authorization
//!
//! The caller is a SPIFFE ID from the transport ([`PeerIdentity`], set by the mTLS
//! acceptor of `serve_tls`, feature `tls`: no client certificate, or a certificate
//! without exactly one SPIFFE URI SAN -> 401 on every route; a certificate that does not
//! chain to the client CAs -> the handshake is refused), or, only with [`ServiceOptions::insecure_dev_identity`], from the
//! [`DEV_IDENTITY_HEADER`]. No identity, or the dev header without dev mode: 401. What a
//! caller may do comes from [`Authz`] (TOML, reloadable). Sessions belong to the identity
//! that opened them: keepalive, acquire, release and close by anyone else are 403.
//!
//! # Quotas (per namespace)
//!
//! `held_lease_quota` ([`Namespace`](crate::Namespace)): at most that many sessions
//! opened with the namespace, holds and waits of the namespace at once, across all
//! replicas. A session opened with `"namespace"` takes a slot for as long as its lease
//! lives (caller granted some class of the namespace, or its admin; over the quota: 429
//! and the session is revoked at once). Each acquire takes a slot (a key
//! `<root>quota/<ns>/...` on the session's lease) before it waits; the slot is deleted
//! when the wait fails, when the hold is released, or with the session's lease (closed,
//! or expired: it stops counting within one TTL). Taking a slot counts the namespace's
//! slots at a revision and creates the new one in a Txn that compares the whole slot
//! range against that revision, so concurrent acquires through any replicas never
//! exceed the quota. Over the quota: 429 `quota-exceeded`, naming `held_lease_quota`.
//! A session opened without a namespace counts only through its holds and waits (it
//! may lock in several namespaces). A
//! lowered quota refuses new slots until the count is below it; existing holds stay.
//! A hold force-released keeps its slot until its session releases it or ends.
//!
//! `op_rate_quota`: acquire, release and status calls of a namespace draw from a token
//! bucket of `op_rate_quota` operations refilled at `op_rate_quota` per second; an empty
//! bucket answers 429 `quota-exceeded` naming `op_rate_quota`, with `Retry-After` in
//! whole seconds. Each replica keeps its own buckets, so `n` replicas admit up to
//! `n × op_rate_quota` operations per second in all.
//!
//! # Force release, by two people
//!
//! Needs [`ServiceOptions::with_force_releases`] (a PostgreSQL table of requests,
//! [`FORCE_RELEASE_MIGRATION`], and a [`ForceReleaseAudit`] sink); without it the routes
//! are 404. An admin of the namespace requests the release of a lock key with a reason
//! (reason 1 to 1024 bytes); a *different* admin approves it: the requester approving
//! their own request is 403 `forbidden`, a second approval 409 `already-approved` (the
//! approval is one conditional `UPDATE`, so only one replica wins). Only on approval
//! is every current hold of the key deleted ([`Locker::force_release_grant`], one Txn per
//! hold, marked as forced), and each deletion recorded through the [`ForceReleaseAudit`]
//! with the revision of its Txn, requester, approver, reason and whether the class was
//! fenced. An approval that finds no holder deletes nothing and answers `released: []`.
//!
//! etcd calls of an approval go through the shared retry (a dead member is left for
//! the others). If etcd or the database still fails after the approval is recorded, the
//! answer is the failure (503, 502...) and the request stays approved but not executed:
//! the holds it found are stored with it before any is deleted, and approving it again
//! (the approver or another admin of the namespace, never the requester) deletes those
//! that remain, each at most once (the delete compares the hold's grant revision, so a
//! later holder of the key is never touched), and records each in the audit trail once.
//! Only an executed request answers 409 `already-approved`. The request table is used
//! through a connection pool (deadpool-postgres); a statement whose connection the
//! server ended is run again on another connection.
//!
//! **The window after a force release.** The deleted holder's token is still the highest
//! any resource has seen until the *next* holder writes with its (higher) token. Until
//! then a fenced resource cannot tell the old holder is gone and still admits its
//! writes: fencing refuses a token only once a newer one has been seen. The class's
//! lock-delay keeps the next grant back (no one is granted the lock for `lock_delay`
//! after the forced delete), which gives the old holder time to notice the loss (its
//! keepalive or release answers `not-held`) before anyone else writes; it does not stop
//! the old holder from writing in that window. Once the next holder has written with its
//! token, every resource it wrote to refuses the old token (409 `stale`).
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
mod force;
mod identity;
mod metrics;
mod openapi;
mod problem;
mod quota;
mod rate;
mod routes;
#[cfg(feature = "tls")]
mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

pub use authz::{Authz, AuthzConfig, AuthzError, Grant, NamespaceRules};
pub use force::{
    ForceDbError, ForceReleaseAudit, ForceReleases, ForcedRelease, FORCE_RELEASE_MIGRATION,
};
pub use identity::{PeerIdentity, DEV_IDENTITY_HEADER};
pub use problem::{Problem, ProblemKind};
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use routes::fuzzing::{parse_body, BodyRoute};
#[cfg(feature = "tls")]
pub use tls::{serve_tls, server_config, spiffe_id_of, TlsConfigError};

use crate::locker::Locker;

/// How the service is built.
#[derive(Debug, Clone)]
#[must_use]
pub struct ServiceOptions {
    authz: Authz,
    dev_identity: bool,
    body_limit: usize,
    max_wait: Duration,
    max_ttl: Duration,
    force: Option<ForceReleases>,
}

impl ServiceOptions {
    /// Identity from the transport only; body limit 16 KiB; waits up to 60 s; TTLs up
    /// to 1 h.
    pub fn new(authz: Authz) -> Self {
        ServiceOptions {
            authz,
            dev_identity: false,
            body_limit: 16 * 1024,
            max_wait: Duration::from_secs(60),
            max_ttl: Duration::from_secs(3600),
            force: None,
        }
    }

    /// INSECURE: takes the caller's identity from the [`DEV_IDENTITY_HEADER`], which
    /// anyone can set. [`serve_dev`] then binds to loopback only and warns at start.
    pub fn insecure_dev_identity(mut self) -> Self {
        self.dev_identity = true;
        self
    }

    /// The largest request body accepted, in bytes; larger bodies get 413.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
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

    /// The longest session TTL.
    pub fn with_max_ttl(mut self, max: Duration) -> Self {
        self.max_ttl = max;
        self
    }
}

/// The `/v1` router over `locker`.
pub fn router(locker: Locker, options: ServiceOptions) -> Router {
    routes::router(locker, options)
}

/// Every route the router serves, as `(method, path)` with path parameters in braces
/// (`/v1/sessions/{session}`), in the order of the table in these docs. The router is
/// built from the same table; `GET /v1/openapi.json` documents exactly these.
pub fn routes() -> Vec<(axum::http::Method, &'static str)> {
    routes::routes()
}

/// The OpenAPI 3.1 document of every route, as served at `GET /v1/openapi.json`.
pub fn openapi_json() -> String {
    routes::openapi().to_json().unwrap_or_default()
}

/// Why [`serve_dev`] did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Plain HTTP has no caller identities: it is only for dev mode.
    #[error("plain HTTP needs the insecure dev identity option")]
    DevIdentityNotEnabled,
    /// Dev mode binds to loopback only.
    #[error("dev mode binds to loopback only, not {0}")]
    NotLoopback(SocketAddr),
    /// Accepting or serving failed.
    #[error("serving failed")]
    Io(#[from] std::io::Error),
}

/// Serves the API over plain HTTP in dev mode: refused unless `options` has
/// [`ServiceOptions::insecure_dev_identity`] and `listener` is on a loopback address.
/// Logs a warning at start. Runs until the listener fails.
///
/// # Errors
///
/// [`ServeError`].
pub async fn serve_dev(
    listener: TcpListener,
    locker: Locker,
    options: ServiceOptions,
) -> Result<(), ServeError> {
    if !options.dev_identity {
        return Err(ServeError::DevIdentityNotEnabled);
    }
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    tracing::warn!(%addr, "INSECURE dev identity: callers are whoever the {DEV_IDENTITY_HEADER} header says; loopback only");
    axum::serve(listener, router(locker, options)).await?;
    Ok(())
}
