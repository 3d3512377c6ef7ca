//! A private PgBouncer in transaction pool mode, in front of the shared PostgreSQL server.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::pg_server::{free_port, is_root, run, setpriv, PgServerError};

/// Where Debian's `pgbouncer` package installs the binary.
const PGBOUNCER_BIN: &str = "/usr/sbin/pgbouncer";
/// How long a start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A PgBouncer of its own: a config in a temp dir, listening on a free loopback port, in
/// `pool_mode = transaction` (each transaction may run on any server connection, so
/// session state such as a prepared statement does not follow the client), forwarding
/// every database name to a PostgreSQL server (by default `127.0.0.1:5432`, the shared
/// server tests use) as the `postgres` role with `trust` authentication.
///
/// The process runs as the `postgres` OS user when the caller is root (PgBouncer refuses
/// root), with a parent-death signal so that it cannot outlive its parent thread.
/// Dropping the value stops it and removes the directory.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), palisade_testkit::PgServerError> {
/// use palisade_testkit::PgBouncer;
///
/// let bouncer = PgBouncer::start().await?;
/// // "host=127.0.0.1 port=41235 user=postgres dbname=mydb", pooled per transaction.
/// let conn = bouncer.connection_string("mydb");
/// # let _ = conn;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    process: Option<Child>,
    // Last, so the process is stopped (in `drop`) before the directory goes.
    dir: TempDir,
}

impl PgBouncer {
    /// Starts a PgBouncer in front of `127.0.0.1:5432`; returns once it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// As [`PgBouncer::start_for`].
    pub async fn start() -> Result<PgBouncer, PgServerError> {
        PgBouncer::start_for("127.0.0.1", 5432, 20).await
    }

    /// Starts a PgBouncer in front of the server at `host:port`, with at most
    /// `pool_size` server connections per database; returns once it accepts connections.
    ///
    /// # Errors
    ///
    /// [`PgServerError::PgBouncerMissing`] without `/usr/sbin/pgbouncer` (Debian's
    /// `pgbouncer` package; `scripts/test` installs it), a failed set-up command, or a
    /// PgBouncer that does not accept connections within 30 s (with its log).
    pub async fn start_for(
        host: &str,
        port: u16,
        pool_size: u32,
    ) -> Result<PgBouncer, PgServerError> {
        if !Path::new(PGBOUNCER_BIN).is_file() {
            return Err(PgServerError::PgBouncerMissing);
        }
        let dir = tempfile::Builder::new()
            .prefix("palisade-pgbouncer-")
            .tempdir()
            .map_err(|source| io("creating the pgbouncer temp dir", source))?;
        let listen = free_port()?;
        let ini = format!(
            "[databases]\n\
             * = host={host} port={port} user=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {listen}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             max_db_connections = {pool_size}\n\
             server_reset_query =\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            auth = dir.path().join("users.txt").display(),
            log = dir.path().join("pgbouncer.log").display(),
            pid = dir.path().join("pgbouncer.pid").display(),
        );
        write(&dir.path().join("pgbouncer.ini"), &ini)?;
        write(&dir.path().join("users.txt"), "\"postgres\" \"\"\n")?;
        write(&dir.path().join("pgbouncer.log"), "")?;
        let as_postgres = is_root()?;
        if as_postgres {
            run(
                Command::new("chown")
                    .args(["-R", "postgres:"])
                    .arg(dir.path()),
                "chown of the pgbouncer dir",
            )?;
        }
        let mut command = setpriv(as_postgres, true);
        command
            .arg(PGBOUNCER_BIN)
            .arg(dir.path().join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command
            .spawn()
            .map_err(|source| io("starting pgbouncer", source))?;
        let mut bouncer = PgBouncer {
            port: listen,
            process: Some(child),
            dir,
        };
        bouncer.wait_until_listening().await?;
        Ok(bouncer)
    }

    /// The port PgBouncer listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq key/value connection string for `dbname` through PgBouncer, as the
    /// `postgres` role.
    pub fn connection_string(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={dbname}",
            self.port
        )
    }

    /// The last `lines` lines of PgBouncer's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }

    async fn wait_until_listening(&mut self) -> Result<(), PgServerError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.process.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.process = None;
                    return Err(self.not_started(format!("it exited ({status})")));
                }
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(self.not_started(format!("no listener within {START_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn not_started(&self, reason: String) -> PgServerError {
        PgServerError::NotStarted {
            port: self.port,
            reason: format!("pgbouncer: {reason}"),
            log: self.log_tail(20),
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn write(path: &Path, text: &str) -> Result<(), PgServerError> {
    std::fs::write(path, text).map_err(|source| io(&format!("writing {}", path.display()), source))
}

fn io(what: &str, source: std::io::Error) -> PgServerError {
    PgServerError::Io {
        what: what.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::NoTls;

    /// In transaction mode a statement prepared in one transaction is not there for the
    /// next one run elsewhere: two clients, each holding a transaction open in turn, see
    /// two different server backends through one pooled database.
    #[tokio::test]
    async fn pgbouncer_pools_per_transaction_and_is_gone_after_drop() {
        let bouncer = PgBouncer::start().await.unwrap();
        let conn = bouncer.connection_string("postgres");
        let (a, ca) = tokio_postgres::connect(&conn, NoTls).await.unwrap();
        tokio::spawn(ca);
        let (b, cb) = tokio_postgres::connect(&conn, NoTls).await.unwrap();
        tokio::spawn(cb);
        a.batch_execute("BEGIN").await.unwrap();
        let pid_a: i32 = a
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        // While a's transaction holds its backend, b's statements run on another one.
        let pid_b: i32 = b
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        assert_ne!(pid_a, pid_b);
        a.batch_execute("COMMIT").await.unwrap();
        // Outside a transaction, b may get a's former backend: the pool is shared.
        let port = bouncer.port();
        assert_ne!(port, 5432);
        let dir = bouncer.dir.path().to_owned();
        drop(bouncer);
        assert!(!dir.exists(), "the config dir is removed");
        assert!(
            tokio_postgres::connect(&conn, NoTls).await.is_err(),
            "nothing listens after drop"
        );
    }
}
