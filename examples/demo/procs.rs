//! The demo's processes: starting them, reading what they announce, waiting for
//! ports, the database, and stopping everything again.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_testkit::EtcdCluster;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{Error, CALL_LIMIT};

/// `fut`, or an error naming `what` if it takes longer than `limit`.
pub(crate) async fn bounded<T, E>(
    what: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, Error>
where
    E: Into<Error>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(format!("{what}: no answer in {} s", limit.as_secs()).into()),
    }
}

/// Every process the demo started, stopped in reverse order at the end, etcd last.
#[derive(Default)]
pub(crate) struct Procs {
    pub(crate) children: Vec<(String, Child)>,
    pub(crate) stopped: Vec<u32>,
    pub(crate) etcd: Option<EtcdCluster>,
    pub(crate) etcd_pids: Vec<u32>,
}

impl Procs {
    pub(crate) fn spawn(
        &mut self,
        name: &str,
        mut cmd: Command,
        logs: &Path,
    ) -> Result<&mut Child, Error> {
        let log = std::fs::File::create(logs.join(format!("{name}.log")))?;
        cmd.stderr(Stdio::from(log)).kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| format!("starting {name}: {e}"))?;
        self.children.push((name.to_owned(), child));
        Ok(&mut self.children.last_mut().expect("just pushed").1)
    }

    /// Every process id, the etcd members' as they were started included.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children
            .iter()
            .filter_map(|(_, c)| c.id())
            .chain(self.etcd_pids.iter().copied())
            .collect()
    }

    pub(crate) async fn stop_all(&mut self) {
        for pid in self.stopped.drain(..) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
        while let Some((name, mut child)) = self.children.pop() {
            if let Some(pid) = child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                eprintln!("{name} did not stop on SIGTERM; killing it");
                let _ = child.kill().await;
            }
        }
        // Dropping the cluster kills and reaps its members.
        self.etcd.take();
    }

    /// The etcd cluster, once started.
    pub(crate) fn etcd(&mut self) -> Result<&mut EtcdCluster, Error> {
        self.etcd
            .as_mut()
            .ok_or_else(|| "etcd is not running".into())
    }

    /// Starts three etcd members and waits until each is healthy.
    pub(crate) async fn start_etcd(&mut self) -> Result<&mut EtcdCluster, Error> {
        // The kit panics when etcd cannot start; the task turns that into an error.
        let cluster = tokio::spawn(EtcdCluster::start(3))
            .await
            .map_err(|e| format!("starting etcd: {e}"))?;
        self.etcd_pids = (0..cluster.member_count())
            .filter_map(|i| cluster.pid(i))
            .collect();
        Ok(self.etcd.insert(cluster))
    }

    /// The etcd leader's member index, once there is one (up to 15 s).
    pub(crate) async fn etcd_leader(&mut self) -> Result<usize, Error> {
        let cluster = self.etcd.take().ok_or("etcd is not running")?;
        let (cluster, leader) = tokio::spawn(async move {
            let leader = cluster.leader().await;
            (cluster, leader)
        })
        .await
        .map_err(|e| format!("waiting for an etcd leader: {e}"))?;
        self.etcd = Some(cluster);
        Ok(leader)
    }

    /// The last lines of each etcd member's log.
    pub(crate) fn etcd_logs(&self) -> Vec<(String, String)> {
        let Some(cluster) = &self.etcd else {
            return Vec::new();
        };
        (0..cluster.member_count())
            .map(|i| (format!("etcd member m{i}"), cluster.log_tail(i, 20)))
            .collect()
    }
}

/// Parent-death signal, so that nothing outlives a demo killed with SIGKILL.
pub(crate) fn command(program: &Path) -> Command {
    let mut c = match which("setpriv") {
        Some(setpriv) => {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(program);
            c
        }
        None => Command::new(program),
    };
    c.stdin(Stdio::null());
    c
}

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

pub(crate) fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Reads the child's stdout until a line starting with `prefix`; returns the rest of it.
pub(crate) async fn announced(child: &mut Child, prefix: &str) -> Result<String, Error> {
    let stdout = child.stdout.take().ok_or("stdout not piped")?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok::<_, Error>(rest.trim().to_owned());
            }
        }
        Err("exited before it was ready (see its log)".into())
    })
    .await
    .map_err(|_| "not ready after 60 s")??;
    // Keep reading, so the child never writes to a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(found)
}

pub(crate) async fn wait_port(port: u16) -> Result<(), Error> {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("nothing listens on port {port} after 60 s").into())
}

pub(crate) async fn pg(conn: &str) -> Result<tokio_postgres::Client, Error> {
    let (client, connection) = bounded(
        "connecting to PostgreSQL",
        CALL_LIMIT,
        tokio_postgres::connect(conn, tokio_postgres::NoTls),
    )
    .await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Runs `sql` on a new connection to `conn`, within [`CALL_LIMIT`].
pub(crate) async fn pg_batch(conn: &str, sql: &str) -> Result<(), Error> {
    bounded(sql, CALL_LIMIT, pg(conn).await?.batch_execute(sql)).await
}

/// Drops the databases that demos killed before their cleanup left behind: each
/// `palisade_demo_<pid>` but `own` whose process is gone from this host. Without
/// `FORCE`, so a database still in use (say a demo of another host sharing this server)
/// is kept. Returns the names dropped.
pub(crate) async fn sweep_databases(admin: &str, own: &str) -> Result<Vec<String>, Error> {
    let client = pg(admin).await?;
    let rows = bounded(
        "listing demo databases",
        CALL_LIMIT,
        client.query(
            "SELECT datname FROM pg_database WHERE datname ~ '^palisade_demo_[0-9]+$'",
            &[],
        ),
    )
    .await?;
    let mut dropped = Vec::new();
    for row in rows {
        let name: String = row.get(0);
        let Some(pid) = name.strip_prefix("palisade_demo_") else {
            continue;
        };
        if name == own || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let drop = format!("DROP DATABASE IF EXISTS {name}");
        if bounded(&drop, CALL_LIMIT, client.batch_execute(&drop))
            .await
            .is_ok()
        {
            dropped.push(name);
        }
    }
    Ok(dropped)
}

pub(crate) async fn drop_database(admin: &str, dbname: &str) -> Result<(), Error> {
    pg_batch(
        admin,
        &format!("DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"),
    )
    .await
}
