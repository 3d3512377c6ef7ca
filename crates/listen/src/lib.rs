//! Palisade's HTTP listeners: one accept loop, [`serve`], for every server Palisade runs
//! (the lock service in dev mode and over mTLS, the audit dashboard), so that each keeps
//! the same rules against clients that hold connections without using them.
//!
//! - **Descriptor exhaustion does not stop it.** A failed accept is retried after a
//!   backoff (1 ms doubling to 1 s). Out of file descriptors (`EMFILE`, `ENFILE`), it
//!   also closes the oldest idle connection, and logs a warning naming the open-file
//!   limit (`RLIMIT_NOFILE`, soft and hard) at most every 10 s.
//! - **Every wait is bounded** ([`ConnLimits`]): the TLS handshake, the request head
//!   (which also bounds an idle keep-alive connection), a request body that stalls, and
//!   a response the client stops reading.
//! - **Connections are capped** per listener. At the cap an idle connection makes room
//!   for a new one; when every connection has a request in flight, a small reserve
//!   answers the probe paths only (e.g. `/livez`, `/readyz`), so a supervisor still sees
//!   the process alive.
//! - **Shutdown is graceful**: no new connection, idle ones close, requests in flight
//!   are answered.
//!
//! HTTP/1.1 (hyper's server with a tokio timer), and HTTP/2 next to it with
//! [`ConnLimits::with_http2`]; a service may take a connection's upgrade (answer 101 and
//! `hyper::upgrade::on` the request). The service is any tower service over axum's
//! [`Body`](axum::body::Body), built per connection from its [`Peer`].
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use std::time::Duration;
//! use palisade_listen::{serve, ConnLimits, Transport};
//!
//! let app = axum::Router::new().route("/livez", axum::routing::get(|| async { "ok" }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let limits = ConnLimits::new()
//!     .with_header_timeout(Duration::from_secs(10))
//!     .with_probe_paths(["/livez"]);
//! serve(listener, Transport::Plain, limits, move |_peer| app.clone(), std::future::pending()).await;
//! # Ok(()) }
//! ```

mod accept;
mod conn;
mod io;
mod limits;
mod service;
mod table;

pub use accept::{serve, Transport};
pub use conn::Peer;
pub use limits::{
    ConnLimits, DEFAULT_BODY_STALL_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_PROBE_RESERVE,
};
