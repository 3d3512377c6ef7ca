//! [`ChaosError`]: why a run could not be carried out (not a safety violation: those are
//! the checker's findings).

use std::io;

/// A run that could not be set up, driven or read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// Bad options (zero workers, a duration too short for one fault, ...).
    #[error("invalid options: {0}")]
    InvalidOptions(&'static str),
    /// A file, process or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The private PostgreSQL server could not be set up or restarted.
    #[error(transparent)]
    PgServer(#[from] palisade_testkit::PgServerError),
    /// A statement on the private PostgreSQL failed.
    #[error("{what}: {source}")]
    Postgres {
        /// What was being done.
        what: String,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The audit trail (schema, pool, tailer) failed.
    #[error(transparent)]
    Audit(#[from] palisade_audit::AuditError),
    /// etcd failed while reading its history.
    #[error("{what}: {source}")]
    Etcd {
        /// What was being done.
        what: String,
        /// The client error.
        #[source]
        source: etcd_client::Error,
    },
    /// The lock service refused or failed a setup call.
    #[error("{what}: {source}")]
    Service {
        /// What was being done.
        what: String,
        /// The client error.
        #[source]
        source: palisade_client::ClientError,
    },
    /// A part did not become ready in time.
    #[error("{0} was not ready in time")]
    NotReady(String),
    /// A worker process wrote a line that is not a history entry.
    #[error("worker {worker} wrote a line that is not a history entry: {source}")]
    WorkerOutput {
        /// The worker's number.
        worker: u32,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// The history file could not be read back.
    #[error(transparent)]
    History(#[from] crate::history::ReadError),
    /// The run's network hosts could not be made, used or removed (without the
    /// privilege: [`crate::net::NetError::NoPrivilege`], which suggests `--loopback`).
    #[error(transparent)]
    Net(#[from] crate::net::NetError),
    /// A signal interrupted the run. Its processes, directories and network hosts were
    /// removed; the history holds whole lines up to then and was not checked.
    #[error(
        "interrupted by {signal}: the run's processes, directories and network hosts were \
         removed; the history so far (not checked) is in {}",
        history.display()
    )]
    Interrupted {
        /// The signal.
        signal: crate::Interrupt,
        /// The history file.
        history: std::path::PathBuf,
    },
    /// The run panicked (a part of the test kit failed loudly); the message says why.
    #[error("the run failed: {0}")]
    Panicked(String),
}

impl ChaosError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> ChaosError {
        let what = what.into();
        move |source| ChaosError::Io { what, source }
    }

    pub(crate) fn pg(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> ChaosError {
        let what = what.into();
        move |source| ChaosError::Postgres { what, source }
    }

    pub(crate) fn etcd(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> ChaosError {
        let what = what.into();
        move |source| ChaosError::Etcd { what, source }
    }

    pub(crate) fn service(
        what: impl Into<String>,
    ) -> impl FnOnce(palisade_client::ClientError) -> ChaosError {
        let what = what.into();
        move |source| ChaosError::Service { what, source }
    }
}
