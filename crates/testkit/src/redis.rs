//! Redis for tests: the shared server with a key prefix per test ([`TestRedis`]), and a
//! private `redis-server` that a test may kill and start again ([`RedisServer`]).

use std::io;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::pg_server::setpriv;

/// The variable that names the shared Redis (default [`DEFAULT_REDIS_URL`]).
pub const REDIS_URL_VARIABLE: &str = "PALISADE_REDIS_URL";
/// The shared Redis when [`REDIS_URL_VARIABLE`] is unset.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// How long a private server may take to answer `PING` after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The shared Redis's URL: `PALISADE_REDIS_URL`, or `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var(REDIS_URL_VARIABLE).unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned())
}

/// A key prefix of one test's own on the shared Redis; dropping it deletes every key that
/// starts with the prefix (`SCAN MATCH <prefix>*`, then `DEL`).
///
/// Keys a test makes outside the prefix are its own to delete.
#[derive(Debug)]
pub struct TestRedis {
    url: String,
    prefix: String,
}

impl TestRedis {
    /// A fresh prefix, `palisade-test:<pid>-<n>-<nanos>:`, on the shared Redis. Checks that
    /// the server answers.
    ///
    /// # Panics
    ///
    /// When the shared Redis does not answer `PING`: the message names `scripts/test`,
    /// which installs and starts it.
    pub async fn create() -> TestRedis {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let url = redis_url();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let prefix = format!(
            "palisade-test:{}-{}-{nanos}:",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let answered = async {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        if let Err(e) = tokio::time::timeout(Duration::from_secs(5), answered)
            .await
            .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut).into()))
        {
            panic!("no Redis answers at {url} ({REDIS_URL_VARIABLE}): {e}; run scripts/test, which installs and starts redis-server");
        }
        TestRedis { url, prefix }
    }

    /// The shared Redis's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The test's prefix (ends with `:`; holds no glob character and no brace).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix><name>`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A connection manager on the shared Redis.
    ///
    /// # Panics
    ///
    /// When Redis does not answer.
    pub async fn manager(&self) -> redis::aio::ConnectionManager {
        let client = redis::Client::open(self.url.as_str()).expect("a valid Redis URL");
        redis::aio::ConnectionManager::new(client)
            .await
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.url))
    }

    /// The keys under the prefix, sorted.
    ///
    /// # Panics
    ///
    /// When Redis does not answer.
    pub async fn keys(&self) -> Vec<String> {
        let mut conn = self.manager().await;
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        keys.sort();
        keys
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return;
        };
        let pattern = format!("{}*", self.prefix);
        let mut cursor = 0u64;
        loop {
            let page: redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn);
            let Ok((next, keys)) = page else { return };
            if !keys.is_empty() {
                let _ = redis::cmd("DEL").arg(keys).query::<i64>(&mut conn);
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}

/// How a private server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisPersistence {
    /// Nothing is written to disk (`save ""`, `appendonly no`): a restart starts empty.
    None,
    /// The append-only file with `appendfsync always`: every write is on disk before
    /// Redis answers it.
    AofAlways,
}

/// Why a private Redis could not be started or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisServerError {
    /// No `redis-server` on the `PATH` (install Debian's `redis-server`; the project's
    /// `scripts/test` does).
    #[error("no redis-server on the PATH: run scripts/test, which installs redis-server")]
    BinaryMissing,
    /// A process or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The server did not answer `PING` in time, or exited while starting.
    #[error("redis-server on port {port} did not start: {reason}; log tail:\n{log}")]
    NotStarted {
        /// Its port.
        port: u16,
        /// What was seen.
        reason: String,
        /// The end of its log.
        log: String,
    },
}

/// A `redis-server` of its own: a temp dir, a free loopback port, [`RedisPersistence`] as
/// asked. [`kill`](Self::kill) sends SIGKILL (no shutdown save, no final fsync);
/// [`start_again`](Self::start_again) starts it on the same port and dir, where it loads
/// what it persisted. The process gets a parent-death signal, so it cannot outlive the
/// test; dropping the value kills it and removes the dir.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    persistence: RedisPersistence,
    process: Option<Child>,
    // Last, so the server is killed (in `drop`) before the directory goes.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server; returns once it answers `PING`.
    ///
    /// # Errors
    ///
    /// [`RedisServerError::BinaryMissing`], or a server that does not answer in 15 s.
    pub async fn start(persistence: RedisPersistence) -> Result<RedisServer, RedisServerError> {
        let dir = tempfile::Builder::new()
            .prefix("palisade-redis-")
            .tempdir()
            .map_err(|source| RedisServerError::Io {
                what: "creating the server's temp dir".into(),
                source,
            })?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|source| RedisServerError::Io {
                what: "picking a free port".into(),
                source,
            })?;
        let mut server = RedisServer {
            port,
            persistence,
            process: None,
            dir,
        };
        server.start_again().await?;
        Ok(server)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the server process is running (as far as this value knows).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// SIGKILL, and waits for the process to end. Does nothing when it is not running.
    ///
    /// # Errors
    ///
    /// [`RedisServerError::Io`] when it cannot be killed or reaped.
    pub fn kill(&mut self) -> Result<(), RedisServerError> {
        let Some(mut child) = self.process.take() else {
            return Ok(());
        };
        child.kill().map_err(|source| RedisServerError::Io {
            what: "killing redis-server".into(),
            source,
        })?;
        child
            .wait()
            .map(drop)
            .map_err(|source| RedisServerError::Io {
                what: "reaping redis-server".into(),
                source,
            })
    }

    /// Starts the server on its port and dir (after [`kill`](Self::kill)); returns once it
    /// answers `PING`. Does nothing when it is running.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_again(&mut self) -> Result<(), RedisServerError> {
        if self.process.is_some() {
            return Ok(());
        }
        let log = self.dir.path().join("redis.log");
        let mut command = setpriv(false, true);
        command
            .arg("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(["--daemonize", "no", "--save", ""]);
        match self.persistence {
            RedisPersistence::None => command.args(["--appendonly", "no"]),
            RedisPersistence::AofAlways => {
                command.args(["--appendonly", "yes", "--appendfsync", "always"])
            }
        };
        if !redis_server_found() {
            return Err(RedisServerError::BinaryMissing);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| RedisServerError::Io {
                what: "starting redis-server".into(),
                source,
            })?;
        self.process = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.process.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.process = None;
                    return Err(self.not_started(format!("it exited ({status})")));
                }
            }
            if self.answers().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.kill();
                return Err(self.not_started(format!("no PONG within {START_TIMEOUT:?}")));
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
        self.dir.path().join("redis.log")
    }

    async fn answers(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let ping = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), ping).await,
            Ok(Ok(pong)) if pong == "PONG"
        )
    }

    fn not_started(&self, reason: String) -> RedisServerError {
        RedisServerError::NotStarted {
            port: self.port,
            reason,
            log: self.log_tail(20),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn redis_server_found() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
