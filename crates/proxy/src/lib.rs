//! `palisade fence proxy`: a fencing reverse proxy. It puts Palisade's
//! [`FenceLayer`](palisade_fence::FenceLayer) in front of any HTTP service, in any
//! language, without changing its code: a write on a fenced route whose `Fencing-Token`
//! is missing (428), malformed (400) or below the resource's high-water mark (409) is
//! refused and never reaches the upstream.
//!
//! - [`ProxyConfig`]: the TOML file (or the flags of the one-upstream case): listen
//!   address, upstream, routes (path pattern, methods, resource template, policy), the
//!   store, timeouts, audit. Errors name the file, line, field and cause.
//! - [`route`]: patterns, templates, policies, and the path normalization that keeps
//!   every spelling of a fenced path on its route.
//! - [`Proxy`]: binds, serves HTTP/1.1 and h2c, forwards with streamed bodies and
//!   trailers, strips hop-by-hop fields, adds `Forwarded` and `X-Forwarded-*`, passes
//!   `Fencing-Token` on (so the upstream can check it again in SQL), splices upgrades on
//!   open routes, answers an upstream that is down or slow with 502/504, and drains on
//!   shutdown. [`Reloader`] swaps routes and upstream without a restart.
//! - [`ProxyMetrics`]: requests by route pattern and verdict, upstream failures,
//!   latency; served with `/livez` and `/readyz` on the admin listener.
//!
//! The check is the fence crate's, one [`Fence`](palisade_fence::Fence) per route over
//! a shared store: [`MemoryStore`](palisade_fence::MemoryStore) for one replica, or
//! [`PostgresStore`](palisade_fence::PostgresStore), whose marks every replica shares.
//!
//! What the proxy cannot protect: a write that reaches the upstream by another path (a
//! second port, a job, a person with `psql`). The SQL helper covers those: the upstream
//! gets `Fencing-Token` and can repeat the check in the write's transaction.

mod config;
mod forward;
mod metrics;
mod problem;
pub mod route;
mod server;
mod service;

pub use config::{
    AuditConfig, ConfigError, ProxyConfig, StoreConfig, Timeouts, DEFAULT_CAPACITY,
    DEFAULT_MAX_CONNECTIONS,
};
pub use metrics::ProxyMetrics;
pub use problem::ProxyProblem;
pub use server::{Proxy, ProxyError, ReloadError, Reloader};
