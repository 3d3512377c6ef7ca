//! One etcd member process: its directory, ports, command line and signals.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{binary_missing, EtcdBinaries, EtcdTlsFiles};
use crate::Placement;

/// util-linux's `setpriv`, used to tie a member's life to the test process when present.
const SETPRIV: &str = "setpriv";

/// Where a member's process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Paused,
    Stopped,
}

/// One member: a temp dir holding `data/` and `etcd.log`, a client and a peer port on its
/// placement's address (127.0.0.1 by default), and the process while it runs. Dropping it
/// kills and reaps the process before the directory is removed.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) client_port: u16,
    pub(crate) peer_port: u16,
    placement: Placement,
    /// Learned from the cluster once it is up; changes only on a restore with a new id.
    pub(crate) id: u64,
    dir: TempDir,
    process: Option<Child>,
    paused: bool,
    /// Length of the log when the current process started.
    log_start: u64,
    /// TLS: a second client URL, `https://` on this port, with the cluster's files.
    tls: Option<(u16, Arc<EtcdTlsFiles>)>,
}

impl Member {
    pub(crate) fn new(
        name: String,
        client_port: u16,
        peer_port: u16,
        placement: Placement,
    ) -> Member {
        let dir = tempfile::Builder::new()
            .prefix(&format!("palisade-etcd-{name}-"))
            .tempdir_in(temp_root())
            .unwrap_or_else(|e| panic!("creating a temp dir for etcd member {name}: {e}"));
        Member {
            name,
            client_port,
            peer_port,
            placement,
            id: 0,
            dir,
            process: None,
            paused: false,
            log_start: 0,
            tls: None,
        }
    }

    /// Also serves clients over TLS on `port` (`https://`), with the server certificate
    /// of `files`, asking each TLS client for a certificate chained to its CA.
    pub(crate) fn with_tls(mut self, port: u16, files: Arc<EtcdTlsFiles>) -> Member {
        self.tls = Some((port, files));
        self
    }

    /// The TLS client URL, if the member serves one.
    pub(crate) fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|(port, _)| format!("https://{}", SocketAddr::new(self.placement.addr(), *port)))
    }

    pub(crate) fn client_addr(&self) -> SocketAddr {
        SocketAddr::new(self.placement.addr(), self.client_port)
    }

    pub(crate) fn client_url(&self) -> String {
        format!("http://{}", self.client_addr())
    }

    pub(crate) fn peer_url(&self) -> String {
        format!(
            "http://{}",
            SocketAddr::new(self.placement.addr(), self.peer_port)
        )
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Child::id)
    }

    pub(crate) fn state(&self) -> State {
        match (&self.process, self.paused) {
            (None, _) => State::Stopped,
            (Some(_), true) => State::Paused,
            (Some(_), false) => State::Running,
        }
    }

    /// Starts the process. `initial_cluster` is `name=peer_url,...`; it and `token` only
    /// matter while the data dir is empty (first start or right after a restore).
    ///
    /// # Panics
    ///
    /// If the process already runs, or `etcd` cannot be spawned.
    pub(crate) fn spawn(&mut self, initial_cluster: &str, token: &str) {
        assert!(
            self.process.is_none(),
            "etcd member {} is already running",
            self.name
        );
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log_path().display()));
        self.log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        if self.log_start > 0 {
            let _ = writeln!(
                log,
                "--- palisade-testkit: starting {} again ---",
                self.name
            );
            self.log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        }
        let stderr = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cloning log file handle: {e}"));
        let etcd = EtcdBinaries::get().etcd();
        // `setpriv --pdeathsig KILL` execs etcd (same pid) with the parent-death signal
        // set: if the test process dies without unwinding (SIGKILL, a test timeout), the
        // kernel kills the member too. The signal fires when the *thread* that spawned
        // the member exits; a tokio test's runtime threads live as long as the test.
        // A placement's prefix (`ip netns exec NETNS`) runs it in place, so it keeps
        // the pid and the parent-death signal.
        let mut command = match find_on_path(SETPRIV) {
            Some(setpriv) => {
                let mut command = self.placement.command(setpriv);
                command.args(["--pdeathsig", "KILL", "--"]).arg(etcd);
                command
            }
            None => self.placement.command(etcd),
        };
        let child = command
            .args(self.args(initial_cluster, token))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap_or_else(|e| binary_missing(etcd, &e));
        self.process = Some(child);
        self.paused = false;
    }

    fn args(&self, initial_cluster: &str, token: &str) -> Vec<String> {
        let (mut client, peer) = (self.client_url(), self.peer_url());
        let mut tls = Vec::new();
        if let (Some(url), Some((_, files))) = (self.tls_url(), &self.tls) {
            // The plain URL stays for the kit's own health checks and JSON calls.
            client = format!("{client},{url}");
            tls = vec![
                format!("--cert-file={}", files.server_cert().display()),
                format!("--key-file={}", files.server_key().display()),
                format!("--trusted-ca-file={}", files.ca().display()),
                "--client-cert-auth=true".to_owned(),
            ];
        }
        let mut args = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.data_dir().display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-token={token}"),
            "--initial-cluster-state=new".to_owned(),
            // etcd's defaults, spelled out: shorter timeouts elect faster but start
            // spurious elections when the machine is busy compiling.
            "--heartbeat-interval=100".to_owned(),
            "--election-timeout=1000".to_owned(),
            // A paused or restarted member rejoins without forcing an election
            // (the default from etcd 3.5 on).
            "--pre-vote=true".to_owned(),
            "--logger=zap".to_owned(),
            "--log-outputs=stderr".to_owned(),
            "--log-level=info".to_owned(),
        ];
        args.extend(tls);
        args
    }

    /// `Some(status)` once the process has exited (it is then reaped and forgotten).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.process.as_mut()?.try_wait().ok()??;
        self.process = None;
        self.paused = false;
        Some(status)
    }

    /// Whether this run's log says a port was taken (another process won the race for a
    /// port we picked).
    pub(crate) fn lost_port_race(&self) -> bool {
        self.log_since_start().contains("address already in use")
    }

    /// SIGKILL, then reap. A no-op when not running. Works on a paused process too.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// SIGTERM, then waits up to `grace` for the process to exit (a leader hands over
    /// leadership first), then SIGKILL. Reaps it. A no-op when not running.
    pub(crate) async fn stop(&mut self, grace: Duration) {
        let Some(pid) = self.pid() else { return };
        if self.paused {
            self.signal_pause(false);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    ///
    /// # Panics
    ///
    /// If the member is not running or the signal cannot be sent.
    pub(crate) fn signal_pause(&mut self, pause: bool) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("etcd member {} is not running", self.name));
        let signal = if pause { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("running kill {signal} {pid}: {e}"));
        assert!(status.success(), "kill {signal} {pid} failed: {status}");
        self.paused = pause;
        // The signal is delivered asynchronously: wait until every thread has stopped
        // (or left the stopped state), so callers can rely on it when this returns.
        let deadline = Instant::now() + Duration::from_secs(5);
        while (proc_state(pid) == Some('T')) != pause {
            assert!(
                Instant::now() < deadline,
                "etcd member {} (pid {pid}) did not react to {signal}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn log_since_start(&self) -> String {
        let bytes = std::fs::read(self.log_path()).unwrap_or_default();
        let start = usize::try_from(self.log_start)
            .unwrap_or(0)
            .min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// The last `lines` lines of the member's log, all runs included.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A description for panic messages: name, URL, log tail.
    pub(crate) fn describe(&self) -> String {
        format!(
            "etcd member {} (client {}, peer {}); last lines of {}:\n{}",
            self.name,
            self.client_url(),
            self.peer_url(),
            self.log_path().display(),
            self.log_tail(15)
        )
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The state letter of a Linux process (`R`, `S`, `T` stopped, `Z` zombie, ...) from
/// `/proc/<pid>/stat`; `None` when there is no such process.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The first executable file named `name` in a `PATH` directory.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|file| {
            file.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Data dirs go to `/dev/shm` when it exists: etcd fsyncs every commit, and on tmpfs
/// that costs nothing. Otherwise the usual temp dir.
pub(crate) fn temp_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}

/// `count` distinct free ports on 127.0.0.1: bound to port 0 all at once (so distinct),
/// then released for etcd to bind. Another process can take one in between; callers
/// retry with new ports when etcd reports "address already in use".
pub(crate) fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| {
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("binding 127.0.0.1:0: {e}"))
        })
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<io::Result<_>>()
        .expect("local address of a bound listener")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_recognised_as_a_lost_race() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let ports = free_ports(1);
        let mut member = Member::new(
            "m0".to_owned(),
            taken.local_addr().unwrap().port(),
            ports[0],
            Placement::loopback(),
        );
        member.spawn(&format!("m0={}", member.peer_url()), "port-race");
        let deadline = Instant::now() + Duration::from_secs(20);
        while member.exited().is_none() {
            assert!(
                Instant::now() < deadline,
                "etcd did not exit: {}",
                member.describe()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(member.lost_port_race(), "{}", member.describe());
    }
}
