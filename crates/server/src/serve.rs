//! Serving over plain HTTP in dev mode ([`serve_dev`]); mTLS is in `tls`.

use std::net::SocketAddr;

use palisade_lock::Locker;
use tokio::net::TcpListener;

use crate::identity::DEV_IDENTITY_HEADER;
use crate::{router, ServiceOptions};

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
