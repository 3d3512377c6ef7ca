//! Child processes of a run: lock-service replicas (`palisade serve`) and workers
//! (`palisade chaos worker`), each started on its host (a `Place`) through util-linux
//! `setpriv --pdeathsig KILL` so that none outlives the runner, with its stderr in a log
//! file of the run directory.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::layout::{Place, REPLICA_PORT};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::error::ChaosError;
use crate::history::Entry;
use crate::runner::{HOME_TIER, SPARE_TIER};
use crate::worker::WorkerConfig;

/// How long a replica may take to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `program` on `place` (whose prefix runs it in place: same pid, same parent-death
/// signal), with its wall clock.
fn command(place: &Place, program: &Path) -> Command {
    let mut c = place.placement.command("setpriv");
    c.args(["--pdeathsig", "KILL", "--"])
        .arg(program)
        .stdin(Stdio::null());
    if let Some(skew) = &place.skew {
        skew.apply(&mut c);
    }
    let mut c = Command::from(c);
    c.kill_on_drop(true);
    c
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File, ChaosError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .map_err(ChaosError::io(format!("opening {name}.log")))
}

/// Sends `signal` to `pid` (a child of this run).
pub(crate) fn signal(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// Waits up to `limit` for process `pid` to be stopped (state `T` in `/proc/PID/stat`);
/// says whether it is.
pub(crate) async fn wait_stopped(pid: u32, limit: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next());
        if state == Some("T") {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The lock-service replicas: `palisade serve` in dev mode, each on loopback inside its
/// host (reached at the host's address) or on the machine's loopback, sharing one
/// authorization file, one epoch record per tier and one database (force release), each
/// serving the home tier (`--etcd`) and the spare tier (`--tier`).
pub(crate) struct Replicas {
    exe: PathBuf,
    dir: PathBuf,
    etcd: String,
    /// `--tier` of the spare tier: `NAME=ENDPOINTS`.
    spare: String,
    database: String,
    places: Vec<Place>,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

impl Replicas {
    pub(crate) fn new(
        exe: PathBuf,
        dir: PathBuf,
        etcd: &[String],
        spare: &[String],
        database: &str,
        places: Vec<Place>,
    ) -> Result<Replicas, ChaosError> {
        let count = places.len();
        // On a host of its own a replica has the host's whole port range.
        let ports = places
            .iter()
            .map(|p| {
                if !p.placement.addr().is_loopback() {
                    return Ok(REPLICA_PORT);
                }
                std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .map_err(ChaosError::io("picking a free port"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Replicas {
            exe,
            dir,
            etcd: etcd.join(","),
            spare: format!("{SPARE_TIER}={}", spare.join(",")),
            database: database.to_owned(),
            places,
            ports,
            children: (0..count).map(|_| None).collect(),
        })
    }

    pub(crate) fn count(&self) -> usize {
        self.ports.len()
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        (0..self.count()).map(|i| self.url(i)).collect()
    }

    fn url(&self, i: usize) -> String {
        format!("http://{}", self.address(i))
    }

    /// Where clients reach replica `i`: its host's address (forwarded to loopback inside
    /// the host), or loopback.
    fn address(&self, i: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.places[i].placement.addr(), self.ports[i])
    }

    /// Starts replica `i` and waits until it answers HTTP (it binds its port before it
    /// migrates the force release database; two replicas migrating at once can fail).
    pub(crate) async fn start(&mut self, i: usize) -> Result<(), ChaosError> {
        let name = format!("replica-{i}");
        let mut cmd = command(&self.places[i], &self.exe);
        cmd.args([
            "serve",
            "--etcd",
            &self.etcd,
            "--home-tier",
            HOME_TIER,
            "--tier",
            &self.spare,
            "--listen",
            &format!("127.0.0.1:{}", self.ports[i]),
        ])
        .arg("--config")
        .arg(self.dir.join("authz.toml"))
        .arg("--epoch-file")
        .arg(self.dir.join("epoch.json"))
        .arg("--database")
        .arg(&self.database)
        .arg("--insecure-dev-identity")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file(&self.dir, &name)?));
        let child = cmd
            .spawn()
            .map_err(ChaosError::io(format!("starting {name}")))?;
        if let (Some(skew), Some(pid)) = (&self.places[i].skew, child.id()) {
            skew.started(pid);
        }
        self.children[i] = Some(child);
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let client = palisade_client::Client::new(self.url(i))
            .map_err(ChaosError::service(format!("building a client of {name}")))?;
        let answers = || async {
            let call = client.call_json("GET", palisade_api::routes::OPENAPI, None);
            matches!(
                tokio::time::timeout(Duration::from_secs(2), call).await,
                Ok(Ok(_))
            )
        };
        while !answers().await {
            if let Some(Ok(Some(_))) = self.children[i].as_mut().map(Child::try_wait) {
                return Err(ChaosError::NotReady(format!(
                    "{name} (it exited; see {name}.log)"
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ChaosError::NotReady(name));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Kills replica `i` (SIGKILL) and reaps it.
    pub(crate) async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill().await;
        }
    }

    /// SIGSTOP or SIGCONT to every replica.
    pub(crate) fn signal_all(&self, sig: Signal) {
        for child in self.children.iter().flatten() {
            if let Some(pid) = child.id() {
                signal(pid, sig);
            }
        }
    }

    /// Stops every replica (SIGTERM, then SIGKILL after 5 s).
    pub(crate) async fn stop_all(&mut self) {
        self.signal_all(Signal::SIGCONT);
        for slot in &mut self.children {
            if let Some(mut child) = slot.take() {
                if let Some(pid) = child.id() {
                    signal(pid, Signal::SIGTERM);
                }
                if tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
            }
        }
    }
}

/// The worker processes; their entries arrive on the channel given to [`Workers::spawn`].
pub(crate) struct Workers {
    children: Vec<(Child, Option<ChildStdin>)>,
    readers: Vec<tokio::task::JoinHandle<Result<(), ChaosError>>>,
}

impl Workers {
    /// Starts one `palisade chaos worker` per config, worker `i` on `places[i]`.
    pub(crate) fn spawn(
        exe: &Path,
        dir: &Path,
        configs: Vec<WorkerConfig>,
        places: &[Place],
        entries: &mpsc::UnboundedSender<Entry>,
    ) -> Result<Workers, ChaosError> {
        let mut workers = Workers {
            children: Vec::new(),
            readers: Vec::new(),
        };
        for config in configs {
            let name = format!("worker-{}", config.id);
            let json =
                serde_json::to_string(&config).map_err(|source| ChaosError::WorkerOutput {
                    worker: config.id,
                    source,
                })?;
            let place = places.get(config.id as usize).cloned().unwrap_or_default();
            let mut cmd = command(&place, exe);
            cmd.args(["chaos", "worker", "--config", &json])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log_file(dir, &name)?));
            let mut child = cmd
                .spawn()
                .map_err(ChaosError::io(format!("starting {name}")))?;
            if let (Some(skew), Some(pid)) = (&place.skew, child.id()) {
                skew.started(pid);
            }
            let stdin = child.stdin.take();
            let stdout = child
                .stdout
                .take()
                .ok_or(ChaosError::NotReady(format!("{name}'s stdout")))?;
            let tx = entries.clone();
            let id = config.id;
            workers.readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Some(line) = lines
                    .next_line()
                    .await
                    .map_err(ChaosError::io(format!("reading worker {id}")))?
                {
                    let entry: Entry = serde_json::from_str(&line)
                        .map_err(|source| ChaosError::WorkerOutput { worker: id, source })?;
                    let _ = tx.send(entry);
                }
                Ok(())
            }));
            workers.children.push((child, stdin));
        }
        Ok(workers)
    }

    pub(crate) fn count(&self) -> usize {
        self.children.len()
    }

    pub(crate) fn pid(&self, i: usize) -> Option<u32> {
        self.children.get(i).and_then(|(c, _)| c.id())
    }

    /// Sends worker `i` one line on its stdin (see the worker's commands).
    pub(crate) async fn tell(&mut self, i: usize, line: &str) -> Result<(), ChaosError> {
        let Some((_, Some(stdin))) = self.children.get_mut(i) else {
            return Ok(());
        };
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(ChaosError::io(format!("telling worker {i}")))?;
        stdin
            .flush()
            .await
            .map_err(ChaosError::io(format!("telling worker {i}")))
    }

    /// Closes every worker's stdin (each finishes its cycle and exits), waits up to
    /// `grace`, kills what is left, and waits for their output to be read. Returns the
    /// workers that had exited before they were told to stop, with their exit status.
    pub(crate) async fn stop(mut self, grace: Duration) -> Result<Vec<String>, ChaosError> {
        let mut early = Vec::new();
        for (i, (child, _)) in self.children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                early.push(format!(
                    "worker {i} exited early ({status}; see worker-{i}.log)"
                ));
            }
        }
        for (child, stdin) in &mut self.children {
            if let Some(pid) = child.id() {
                signal(pid, Signal::SIGCONT);
            }
            stdin.take();
        }
        for (child, _) in &mut self.children {
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
        for reader in self.readers {
            reader
                .await
                .map_err(|e| ChaosError::NotReady(format!("a worker reader ({e})")))??;
        }
        Ok(early)
    }
}
