//! The one error type of the bench binary.

/// Why a bench run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BenchError {
    /// PostgreSQL refused or dropped a request.
    #[error("postgres")]
    Postgres(#[from] tokio_postgres::Error),
    /// A fenced write failed where the bench expects it to commit.
    #[error("fenced write")]
    Fence(#[from] palisade_fence::FenceError),
    /// MySQL/MariaDB refused or dropped a request.
    #[error("mysql")]
    Mysql(#[from] mysql_async::Error),
    /// A fenced write on MySQL/MariaDB failed where the bench expects it to commit.
    #[error("fenced write on mysql")]
    MysqlFence(#[from] palisade_fence::mysql::MysqlFenceError),
    /// etcd refused or dropped a request.
    #[error("etcd")]
    Etcd(#[from] etcd_client::Error),
    /// The audit store failed.
    #[error("audit")]
    Audit(#[from] palisade_audit::AuditError),
    /// The Palisade lock core failed.
    #[error("palisade lock")]
    Lock(#[from] palisade_lock::Error),
    /// An HTTP exchange over loopback failed.
    #[error("http")]
    Http(#[from] hyper::Error),
    /// A socket or file operation failed.
    #[error("io")]
    Io(#[from] std::io::Error),
    /// A request got an answer the bench does not expect (status, count, token...).
    #[error("unexpected answer: {0}")]
    Unexpected(&'static str),
}

/// The result type of the bench.
pub(crate) type Result<T, E = BenchError> = std::result::Result<T, E>;
