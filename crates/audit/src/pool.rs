//! The connection pool the sink and the dashboard share.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::AuditError;

/// How long taking, opening or checking a connection may take before it counts as the
/// database being unavailable.
pub const POOL_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of up to `max_size` connections (no TLS) to the database named by
/// `connection_string` (libpq key/value or URL form). Connections are opened on demand,
/// so this succeeds while the database is down.
///
/// # Errors
///
/// [`AuditError::Database`] for a connection string that does not parse,
/// [`AuditError::Config`] when the pool cannot be built.
pub fn pool(connection_string: &str, max_size: usize) -> Result<Pool, AuditError> {
    let config: tokio_postgres::Config = connection_string.parse()?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .recycle_timeout(Some(POOL_TIMEOUT))
        .build()?;
    Ok(pool)
}
