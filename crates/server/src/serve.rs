//! Serving over plain HTTP in dev mode ([`serve_dev`]); mTLS is in `tls`. Both serve the
//! `/v1` router and the probes of `health`, and stop gracefully when their `shutdown`
//! future completes: no new connection is accepted, idle connections close, and each
//! in-flight request is answered before its connection closes. Bounding that wait is the
//! caller's (`palisade serve --shutdown-grace-ms`).

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use palisade_lock::Locker;
use tokio::net::TcpListener;

use crate::identity::DEV_IDENTITY_HEADER;
use crate::{health, router, ServiceOptions};

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
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The API and the probes.
pub(crate) fn app(locker: Locker, options: ServiceOptions) -> Router {
    router(locker.clone(), options).merge(health::router(locker))
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
    axum::serve(listener, app(locker, options))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
