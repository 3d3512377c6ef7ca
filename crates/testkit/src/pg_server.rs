//! A private PostgreSQL server: its own cluster (`initdb`) in a temp dir, on a free loopback
//! port, that a test or a fault-injection run may stop, crash and start again without
//! touching the shared server other tests use.

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio_postgres::NoTls;

use crate::Placement;

/// Where Debian installs the server binaries: `/usr/lib/postgresql/<major>/bin`.
const PG_LIB: &str = "/usr/lib/postgresql";
/// The OS user that owns the cluster when the caller runs as root (`initdb` and `postgres`
/// refuse to run as root).
const PG_OS_USER: &str = "postgres";
/// How long a start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a private server could not be set up, started or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgServerError {
    /// No `/usr/lib/postgresql/<major>/bin/initdb` (install the `postgresql` package; the
    /// project's `scripts/test` does).
    #[error("no PostgreSQL server binaries under {PG_LIB}/*/bin: run scripts/test, which installs PostgreSQL")]
    BinariesMissing,
    /// No `/usr/sbin/pgbouncer` (install the `pgbouncer` package; the project's
    /// `scripts/test` does).
    #[error("no /usr/sbin/pgbouncer: run scripts/test, which installs pgbouncer")]
    PgBouncerMissing,
    /// A command or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A setup command exited unsuccessfully.
    #[error("{what} failed ({status}): {output}")]
    Command {
        /// The command.
        what: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its stderr and stdout, for the reader.
        output: String,
    },
    /// The server did not accept connections in time, or exited while starting.
    #[error("postgres on port {port} did not start: {reason}; log tail:\n{log}")]
    NotStarted {
        /// The port it was given.
        port: u16,
        /// What was seen.
        reason: String,
        /// The end of the server log.
        log: String,
    },
}

/// How to stop the server (the postmaster's signals, see PostgreSQL's "Shutting Down the
/// Server").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopMode {
    /// SIGINT: roll back open transactions, disconnect clients, shut down cleanly.
    Fast,
    /// SIGQUIT: stop at once; the next start runs crash recovery from the WAL.
    Immediate,
}

/// A PostgreSQL cluster of its own: `initdb` into a temp dir (on `/dev/shm` when it exists),
/// `trust` authentication for the `postgres` role, the server listening on `127.0.0.1` (or
/// a [`Placement`]'s address, [`PgServer::start_placed`]) and a free port. The server is a child process (through util-linux `setpriv`, which also
/// drops to the `postgres` OS user when the caller is root and sets a parent-death signal
/// so that it cannot outlive its parent thread).
///
/// Dropping the value stops the server (immediate) and removes the directory.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), palisade_testkit::PgServerError> {
/// use palisade_testkit::{PgServer, StopMode};
///
/// let mut pg = PgServer::start().await?;
/// let conn = pg.connection_string("postgres"); // "host=127.0.0.1 port=41234 user=postgres dbname=postgres"
/// pg.stop(StopMode::Immediate)?;
/// pg.start_again().await?; // same port, same data, after crash recovery
/// # let _ = conn;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    port: u16,
    placement: Placement,
    as_postgres: bool,
    process: Option<Child>,
    // Last, so the server is stopped (in `drop`) before the directory goes.
    dir: TempDir,
}

impl PgServer {
    /// Creates the cluster and starts the server; returns once it accepts connections.
    ///
    /// # Errors
    ///
    /// [`PgServerError::BinariesMissing`], a failed `initdb` or `chown`, or a server that
    /// does not accept connections within 60 s.
    pub async fn start() -> Result<PgServer, PgServerError> {
        PgServer::start_placed(Placement::loopback()).await
    }

    /// [`PgServer::start`], with the server listening on `placement`'s address and run
    /// through its prefix (`initdb` runs in the caller's network). The caller must reach
    /// that address.
    ///
    /// # Errors
    ///
    /// As [`PgServer::start`].
    pub async fn start_placed(placement: Placement) -> Result<PgServer, PgServerError> {
        let bin = server_bin().ok_or(PgServerError::BinariesMissing)?;
        let root = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("palisade-pg-")
            .tempdir_in(root)
            .map_err(|source| PgServerError::Io {
                what: "creating the cluster's temp dir".into(),
                source,
            })?;
        let as_postgres = is_root()?;
        if as_postgres {
            run(
                Command::new("chown")
                    .arg(format!("{PG_OS_USER}:"))
                    .arg(dir.path()),
                "chown of the cluster dir",
            )?;
        }
        let data = dir.path().join("data");
        let mut initdb = setpriv(as_postgres, false);
        initdb.arg(bin.join("initdb")).arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        run(&mut initdb, "initdb")?;
        // initdb trusts local sockets and loopback only; a placed server is reached from
        // its network's own subnet (the server listens on nothing else).
        let mut hba = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("pg_hba.conf"))
            .map_err(|source| PgServerError::Io {
                what: "opening pg_hba.conf".into(),
                source,
            })?;
        std::io::Write::write_all(&mut hba, b"host all all samenet trust\n").map_err(|source| {
            PgServerError::Io {
                what: "writing pg_hba.conf".into(),
                source,
            }
        })?;
        let port = free_port()?;
        let mut server = PgServer {
            bin,
            port,
            placement,
            as_postgres,
            process: None,
            dir,
        };
        server.start_again().await?;
        Ok(server)
    }

    /// The server's port (on 127.0.0.1, or the placement's address).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq key/value connection string for `dbname` as the `postgres` role.
    pub fn connection_string(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={dbname}",
            self.placement.addr(),
            self.port
        )
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Child::id)
    }

    /// Whether the server process is running (as far as this value knows).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Stops the server with `mode` and waits for it to exit (killing it after 30 s).
    /// Does nothing when it is not running.
    ///
    /// # Errors
    ///
    /// [`PgServerError::Io`] if it cannot be signalled or reaped.
    pub fn stop(&mut self, mode: StopMode) -> Result<(), PgServerError> {
        let Some(mut child) = self.process.take() else {
            return Ok(());
        };
        let signal = match mode {
            StopMode::Fast => "INT",
            StopMode::Immediate => "QUIT",
        };
        let pid = child.id().to_string();
        run(
            Command::new("kill").args(["-s", signal, &pid]),
            "signalling postgres",
        )?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    return child
                        .wait()
                        .map(|_| ())
                        .map_err(|source| PgServerError::Io {
                            what: "reaping postgres".into(),
                            source,
                        });
                }
                Err(source) => {
                    return Err(PgServerError::Io {
                        what: "waiting for postgres".into(),
                        source,
                    })
                }
            }
        }
    }

    /// Starts the server on its port and data (after [`PgServer::stop`]); returns once it
    /// accepts connections. Does nothing when it is running.
    ///
    /// # Errors
    ///
    /// As [`PgServer::start`].
    pub async fn start_again(&mut self) -> Result<(), PgServerError> {
        if self.process.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|source| PgServerError::Io {
                what: "opening the server log".into(),
                source,
            })?;
        let stderr = log.try_clone().map_err(|source| PgServerError::Io {
            what: "opening the server log".into(),
            source,
        })?;
        let mut command = self.placement.command("setpriv");
        command.args(setpriv(self.as_postgres, true).get_args());
        command
            .arg(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                &format!("listen_addresses={}", self.placement.addr()),
                "-c",
                "max_connections=200",
            ])
            .arg("-k")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        let child = command.spawn().map_err(|source| PgServerError::Io {
            what: "starting postgres".into(),
            source,
        })?;
        self.process = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        let conn = self.connection_string("postgres");
        loop {
            if let Some(child) = self.process.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.process = None;
                    return Err(self.not_started(format!("it exited ({status})")));
                }
            }
            if let Ok((client, connection)) = tokio_postgres::connect(&conn, NoTls).await {
                drop(client);
                drop(connection);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.stop(StopMode::Immediate);
                return Err(self.not_started(format!("no connection within {START_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn not_started(&self, reason: String) -> PgServerError {
        PgServerError::NotStarted {
            port: self.port,
            reason,
            log: self.log_tail(20),
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.stop(StopMode::Immediate).is_err() {
            if let Some(mut child) = self.process.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The newest `/usr/lib/postgresql/<major>/bin` that has `initdb`.
fn server_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(PG_LIB)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// `setpriv [--reuid/--regid postgres --init-groups] [--pdeathsig KILL] --`.
pub(crate) fn setpriv(as_postgres: bool, pdeathsig: bool) -> Command {
    let mut command = Command::new("setpriv");
    if as_postgres {
        command.args([
            "--reuid",
            PG_OS_USER,
            "--regid",
            PG_OS_USER,
            "--init-groups",
        ]);
    }
    if pdeathsig {
        command.args(["--pdeathsig", "KILL"]);
    }
    command.arg("--");
    command
}

pub(crate) fn is_root() -> Result<bool, PgServerError> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|source| PgServerError::Io {
            what: "running id -u".into(),
            source,
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

pub(crate) fn run(command: &mut Command, what: &str) -> Result<(), PgServerError> {
    let out = command.output().map_err(|source| PgServerError::Io {
        what: what.to_owned(),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(PgServerError::Command {
        what: what.to_owned(),
        status: out.status,
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ),
    })
}

pub(crate) fn free_port() -> Result<u16, PgServerError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| PgServerError::Io {
            what: "picking a free port".into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_private_server_keeps_committed_rows_across_an_immediate_stop() {
        let mut pg = PgServer::start().await.unwrap();
        let conn = pg.connection_string("postgres");
        let (client, connection) = tokio_postgres::connect(&conn, NoTls).await.unwrap();
        let driver = tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
            .await
            .unwrap();
        pg.stop(StopMode::Immediate).unwrap();
        assert!(!pg.is_running());
        // The old connection is gone with the server.
        assert!(client.query_one("SELECT 1", &[]).await.is_err());
        let _ = driver.await;
        assert!(
            tokio_postgres::connect(&conn, NoTls).await.is_err(),
            "nothing listens while stopped"
        );
        pg.start_again().await.unwrap();
        let (client, connection) = tokio_postgres::connect(&conn, NoTls).await.unwrap();
        tokio::spawn(connection);
        let x: i32 = client
            .query_one("SELECT x FROM t", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(x, 7, "a committed row survives crash recovery");
        let port = pg.port();
        assert_ne!(port, 5432, "never the shared server's port");
        let dir = pg.dir.path().to_owned();
        drop(pg);
        assert!(!dir.exists(), "the cluster dir is removed");
        assert!(
            tokio_postgres::connect(&conn, NoTls).await.is_err(),
            "the server is gone"
        );
    }
}
