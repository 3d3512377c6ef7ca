//! The crate's error type.

use std::path::PathBuf;

/// An audit operation failed.
///
/// Classify with the query methods ([`is_unavailable`](Self::is_unavailable),
/// [`is_spool`](Self::is_spool)), not by message text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The database answered with an error, or the connection broke.
    #[error("audit database: {0}")]
    Database(#[from] tokio_postgres::Error),
    /// No connection could be had from the pool (database down, or pool timeout).
    #[error("audit database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The pool could not be built.
    #[error("audit database pool configuration: {0}")]
    Config(#[from] deadpool_postgres::BuildError),
    /// A database call took longer than allowed.
    #[error("audit database did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// etcd could not be reached, or a request or watch failed.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// etcd did not answer within the time allowed (at connect: no member answered).
    #[error("etcd did not answer within {0:?}")]
    EtcdTimeout(std::time::Duration),
    /// Reading or writing the spool file failed.
    #[error("audit spool {path}: {source}")]
    Spool {
        /// The spool file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl AuditError {
    /// True when the database or etcd could not be reached or the connection broke (worth
    /// a retry later), as opposed to an error the database returned for a statement.
    pub fn is_unavailable(&self) -> bool {
        match self {
            AuditError::Pool(_) | AuditError::Timeout(_) => true,
            AuditError::Etcd(_) | AuditError::EtcdTimeout(_) => true,
            AuditError::Database(e) => e.is_closed() || e.code().is_none(),
            _ => false,
        }
    }

    /// True when the spool file could not be read or written.
    pub fn is_spool(&self) -> bool {
        matches!(self, AuditError::Spool { .. })
    }

    /// The SQLSTATE, when the database returned an error for a statement.
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            AuditError::Database(e) => e.code(),
            _ => None,
        }
    }
}
