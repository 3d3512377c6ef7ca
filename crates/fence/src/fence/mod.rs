//! The server-side tower layer: refuse writes whose fencing token is not current.
//!
//! [`FenceLayer`] wraps a service in [`Fence`]. For each request whose method is checked
//! (`POST`, `PUT`, `PATCH`, `DELETE` by default; [`FenceLayer::with_methods`]) and that
//! maps to a resource key (the percent-decoded path by default, see [`decoded_path`];
//! [`FenceLayer::with_resource`]; `None` lets the request through), the layer reads the `Fencing-Token` header and resolves the
//! resource's [`Enforcement`] ([`FenceLayer::with_enforcement`], or a prefix
//! [`EnforcementTable`]). Then:
//!
//! | header | store says | `Fenced` | `Advisory` |
//! |---|---|---|---|
//! | absent, or one empty value | — | **428** Precondition Required | through; event `MissingToken` |
//! | not one decimal token below 2^63 (or repeated) | — | **400** Bad Request | through; event `MalformedToken` |
//! | token | below the mark | **409** Conflict | through; event `Stale` |
//! | token | store unavailable | **503** Service Unavailable | through; event `StoreUnavailable` |
//! | token | admitted (mark raised) | through | through; event `Admitted` |
//!
//! - A refusal never reaches the inner service. Its body is an RFC 9457
//!   `application/problem+json` document with `type`, `title`, `status`, `detail`,
//!   `resource`, and, when known, `token` and `highest` (decimal strings, as JSON numbers
//!   lose precision above 2^53). The [`Rejection`] also rides in the response extensions.
//!   [`FenceLayer::with_rejection_response`] replaces the body and status with your own.
//! - An admitted request carries [`VerifiedToken`] in its extensions; pass it to the
//!   Postgres helper (see *Ordering*).
//! - Events go to the [`WriteObserver`] set with [`FenceLayer::with_observer`]: one per
//!   checked write to an advisory resource, and, with [`FenceLayer::with_fenced_events`],
//!   one per checked write to a fenced resource (admitted or refused).
//!   [`WriteEvent::unprotected`] is true for advisory writes without a current token,
//!   [`WriteEvent::rejected`] for refused fenced writes. Each event carries its time and,
//!   with [`FenceLayer::with_caller`], the caller's identity.
//!   [`FenceLayer::with_refused_events`] reports the refusals of fenced writes without
//!   the admitted ones.
//! - With the `metrics` feature, [`FenceLayer::with_metrics`] counts every checked write
//!   in a [`FenceMetrics`] (admitted, refused by reason, unprotected by finding) for the
//!   service to serve in Prometheus text format.
//! - Readiness is forwarded (`poll_ready` is the inner service's, and the readied service
//!   is the one called, so the inner service must be `Clone`); the error type is the
//!   inner service's; any request body; a response body that is `From<Bytes>` (axum's
//!   `Body`, `Full<Bytes>`, …). Works with `Router::layer`, `Router::route_layer` and
//!   `ServiceBuilder`.
//!
//! # Where to put the layer, and what a token can do to a store
//!
//! Tokens are not authenticated: whoever can send a write can raise a mark. A token
//! far above every granted one (say `9223372036854775807`) makes that resource refuse
//! every real holder — inherent to fencing, so only let callers you trust write at all
//! (mTLS in front of the layer). Two consequences:
//!
//! - Prefer `Router::route_layer`: `Router::layer` also checks requests that match no
//!   route, so junk paths would create marks (and fill a bounded store).
//! - [`MemoryStore`](crate::MemoryStore)'s eviction floor is shared by every resource it
//!   forgot: a flood of huge tokens on throwaway paths raises the floor and so refuses
//!   real writes everywhere until the process restarts. Size the store to the working
//!   set, use `route_layer`, or use [`PostgresStore`](crate::PostgresStore), which never
//!   forgets a mark and has no floor.
//!
//! # Ordering: what the layer guarantees, and what needs the Postgres helper
//!
//! Per resource, the [`HighWaterStore`](crate::HighWaterStore) decides admissions one at
//! a time (atomic compare-and-raise), so **the layer alone** guarantees:
//!
//! 1. a request whose token is below the resource's mark *at the moment of its check*
//!    never reaches the inner service;
//! 2. the tokens admitted for a resource, in the order the store admitted them, never
//!    decrease. With [`MemoryStore`](crate::MemoryStore) that order is per process:
//!    replicas keep separate marks, so replica A may admit 5 after replica B admitted 7.
//!    With [`PostgresStore`](crate::PostgresStore) it holds across every replica sharing
//!    the database.
//!
//! An admission raises the mark whatever the inner service then does: a request it
//! refuses (a body over its limit, a malformed one) leaves the mark at that request's
//! token. That refuses only tokens below one the lock service granted, which a newer grant
//! would refuse anyway; a write is never admitted by it.
//!
//! The layer alone does **not** order the *effects* of admitted requests. The check
//! happens before the handler runs, and handlers run concurrently: if 5 is admitted, then
//! 7 is admitted and its handler writes, the handler of 5 can still write afterwards, over
//! 7's write. The check and the write are not one atomic step at this level.
//!
//! For that, the handler must repeat the check **inside the write's transaction**:
//! [`fenced_transaction`](crate::fenced_transaction) (or
//! [`FencedUpdate`](crate::FencedUpdate)) with the [`VerifiedToken`]'s resource and token.
//! Its raise holds the resource's lock until commit (exclusive when it raises the mark,
//! shared for a token equal to it), so the committed writes of one resource carry
//! non-decreasing tokens, and 5's write in the example is refused as
//! stale. With `PostgresStore` both checks share the `fence_high_water` table: the layer's
//! is an early, cheap refusal (no handler work), the helper's is the atomic one.
//!
//! # Examples
//!
//! ```
//! use axum::{routing::put, Extension, Router};
//! use palisade_fence::{FenceLayer, MemoryStore, VerifiedToken};
//!
//! async fn write(Extension(verified): Extension<VerifiedToken>) -> String {
//!     format!("written under token {}", verified.token)
//! }
//!
//! let app: Router = Router::new()
//!     .route("/orders/{id}", put(write))
//!     .layer(FenceLayer::new(MemoryStore::new(100_000)));
//! ```
//!
//! Advisory resources, with events on a bounded queue:
//!
//! ```
//! use palisade_fence::{ChannelObserver, Enforcement, EnforcementTable, FenceLayer, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let (observer, mut events) = ChannelObserver::bounded(1024);
//! let layer = FenceLayer::new(MemoryStore::new(10_000))
//!     .with_enforcement_table(
//!         EnforcementTable::new(Enforcement::Fenced).with_prefix("/legacy/", Enforcement::Advisory),
//!     )
//!     .with_observer(observer.clone());
//! # drop(layer);
//! tokio::spawn(async move {
//!     while let Some(event) = events.recv().await {
//!         if event.unprotected {
//!             eprintln!("unprotected write to {}", event.resource);
//!         }
//!     }
//! });
//! assert_eq!(observer.dropped(), 0);
//! # }
//! ```

mod future;
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
mod observer;
mod policy;
mod rejection;
mod resource;
mod service;

use http::HeaderName;

use crate::FencingToken;

pub use future::ResponseFuture;
pub use layer::FenceLayer;
#[cfg(feature = "metrics")]
pub use metrics::FenceMetrics;
pub use observer::{ChannelObserver, WriteEvent, WriteObserver, WriteOutcome};
pub use policy::{Enforcement, EnforcementTable};
pub use rejection::{Rejection, RejectionKind};
pub use resource::decoded_path;
pub use service::Fence;

/// The `Fencing-Token` request header: one decimal token.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");

/// The token the layer admitted, in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct VerifiedToken {
    /// The admitted token; the resource's mark was raised to it.
    pub token: FencingToken,
    /// The resource key it was checked against.
    pub resource: String,
}
