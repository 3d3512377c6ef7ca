//! Serving over plain HTTP in dev mode ([`serve_dev`]); mTLS is in `tls`. Both serve the
//! `/v1` router and the probes of `health`, and stop gracefully when their `shutdown`
//! future completes: no new connection is accepted, idle connections close, an acquire
//! still waiting ends at once with 503 `shutting-down` (its waiter key withdrawn), and
//! each in-flight request is answered before its connection closes. Bounding that wait
//! is the caller's (`palisade serve --shutdown-grace-ms`).
//!
//! Both serve through `palisade_listen::serve`, within the options'
//! [`ConnLimits`](palisade_listen::ConnLimits): an accept error (out of file
//! descriptors included) never ends serving, the TLS handshake, the request head (and an
//! idle keep-alive connection) and a stalled request body are bounded, and connections
//! are capped, past which `/livez` and `/readyz` still answer on a small reserve.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use palisade_lock::Locker;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::identity::DEV_IDENTITY_HEADER;
use crate::{health, ServiceOptions};

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
    /// The listener's address could not be read.
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The API and the probes; the handlers learn from `stopping` that the replica stops.
pub(crate) fn app(locker: Locker, options: ServiceOptions, stopping: Stopping) -> Router {
    crate::routes::router(locker.clone(), options, stopping).merge(health::router(locker))
}

/// Whether the replica is stopping, as the handlers see it: set once, when serving's
/// `shutdown` future completes.
#[derive(Clone)]
pub(crate) struct Stopping(watch::Receiver<bool>);

impl Stopping {
    /// A flag and its setter.
    pub(crate) fn new() -> (watch::Sender<bool>, Stopping) {
        let (set, flag) = watch::channel(false);
        (set, Stopping(flag))
    }

    /// A flag that is never set (a router served by the caller's own server).
    pub(crate) fn never() -> Stopping {
        Stopping::new().1
    }

    /// Completes once the replica is stopping; never if the flag cannot be set any more.
    pub(crate) async fn stopped(mut self) {
        if self.0.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Serves the API over plain HTTP in dev mode: refused unless `options` has
/// [`ServiceOptions::insecure_dev_identity`] and `listener` is on a loopback address.
/// Logs a warning at start. Runs until the process ends; no client error stops it.
///
/// # Errors
///
/// [`ServeError`].
pub async fn serve_dev(
    listener: TcpListener,
    locker: Locker,
    options: ServiceOptions,
) -> Result<(), ServeError> {
    serve_dev_until(listener, locker, options, std::future::pending()).await
}

/// [`serve_dev`] until `shutdown` completes, then stops gracefully (see the module
/// docs): returns once every connection has closed.
///
/// # Errors
///
/// [`ServeError`].
pub async fn serve_dev_until(
    listener: TcpListener,
    locker: Locker,
    options: ServiceOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if !options.dev_identity {
        return Err(ServeError::DevIdentityNotEnabled);
    }
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    tracing::warn!(%addr, "INSECURE dev identity: callers are whoever the {DEV_IDENTITY_HEADER} header says; loopback only");
    let (stop, stopping) = Stopping::new();
    let shutdown = async move {
        shutdown.await;
        stop.send_replace(true);
    };
    let limits = listen_limits(&options);
    let app = app(locker, options, stopping);
    palisade_listen::serve(
        listener,
        palisade_listen::Transport::Plain,
        limits,
        move |_: &palisade_listen::Peer| app.clone(),
        shutdown,
    )
    .await;
    Ok(())
}

/// The listener's bounds from `options`, with the probes as the reserve's paths.
pub(crate) fn listen_limits(options: &ServiceOptions) -> palisade_listen::ConnLimits {
    options
        .conn_limits
        .clone()
        .with_probe_paths([health::LIVEZ, health::READYZ])
}
