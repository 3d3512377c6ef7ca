//! The run's network: a "switch" namespace holding one bridge, and one namespace per host
//! joined to the bridge by a veth pair, with an address from a private /24 of the run's
//! own.
//!
//! Nothing is added to the machine's own namespace: both ends of every veth live in
//! namespaces the run made (the switch end in the switch, `eth0` in the host), so the
//! host's interfaces, routes and firewall are untouched, and deleting the namespaces
//! removes everything. Names are `pchaos-<pid>-<n>-<host>`: unique per run, and a later
//! run sweeps the namespaces of runs whose process is gone ([`sweep`]).

use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sched::CloneFlags;

/// The prefix of every namespace a chaos run makes.
pub const PREFIX: &str = "pchaos-";

/// What went wrong setting up, using or removing the run's network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Namespaces cannot be made here.
    #[error(
        "network hosts need root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create network \
         namespaces; run as root, or use --loopback: {0}"
    )]
    NoPrivilege(String),
    /// A tool the network needs is not installed.
    #[error("`{tool}` is not installed (Debian package {package}): {reason}")]
    Missing {
        /// The program.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
        /// What running it said.
        reason: String,
    },
    /// A host name that cannot name a namespace.
    #[error("host name {0:?}: use 1 to 12 characters of a-z, 0-9")]
    InvalidName(String),
    /// A command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr (or how it could not run).
        stderr: String,
    },
    /// Entering a host's namespace, or a socket in it, failed.
    #[error("host {host}: {what}: {source}")]
    Io {
        /// The host.
        host: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// One host: a network namespace with `eth0` on the run's bridge and `lo`.
#[derive(Debug, Clone)]
pub struct Host {
    name: String,
    netns: String,
    addr: Ipv4Addr,
}

impl Host {
    pub(crate) fn new(name: &str, netns: String, addr: Ipv4Addr) -> Host {
        Host {
            name: name.to_owned(),
            netns,
            addr,
        }
    }

    /// The host's name in the run (`etcd0`, `worker1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's name (as `ip netns` lists it).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The host's address on the bridge.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// A command that runs `program` on this host (`ip netns exec NETNS program`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }

    /// Runs `ip netns exec NETNS args...` to its end; an error names the command.
    pub(crate) fn exec(&self, args: &[&str]) -> Result<(), NetError> {
        let mut all = vec!["netns", "exec", &self.netns];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Binds a TCP listener on this host (`addr` and `port`; 0 picks one). The socket
    /// belongs to the host's namespace for its whole life, whichever thread uses it.
    ///
    /// # Errors
    ///
    /// [`NetError::Io`] if the namespace cannot be entered or the bind fails.
    pub fn bind_tcp(&self, port: u16) -> Result<TcpListener, NetError> {
        let addr = SocketAddr::from((self.addr, port));
        self.inside("binding", move || TcpListener::bind(addr))
    }

    /// Binds a UDP socket on this host (`port` 0 picks one).
    ///
    /// # Errors
    ///
    /// [`NetError::Io`] if the namespace cannot be entered or the bind fails.
    pub fn bind_udp(&self, port: u16) -> Result<UdpSocket, NetError> {
        let addr = SocketAddr::from((self.addr, port));
        self.inside("binding", move || UdpSocket::bind(addr))
    }

    /// Connects from this host to `to` within `timeout`.
    ///
    /// # Errors
    ///
    /// [`NetError::Io`] if the namespace cannot be entered or the connection fails.
    pub fn connect_tcp(&self, to: SocketAddr, timeout: Duration) -> Result<TcpStream, NetError> {
        self.inside("connecting", move || {
            TcpStream::connect_timeout(&to, timeout)
        })
    }

    /// Makes TCP connections to this host's address and `port` reach `127.0.0.1:port`
    /// inside it (a `nat` rule and `route_localnet` in the host's own namespace), for a
    /// server that listens on loopback only, as `palisade serve` in dev mode does. Cuts
    /// still apply: the `filter` rules see the peer's address.
    ///
    /// # Errors
    ///
    /// [`NetError::Command`] if `sysctl` or `iptables` fails.
    pub fn forward_to_loopback(&self, port: u16) -> Result<(), NetError> {
        self.exec(&["sysctl", "-q", "-w", "net.ipv4.conf.eth0.route_localnet=1"])?;
        let (addr, port) = (self.addr.to_string(), port.to_string());
        let to = format!("127.0.0.1:{port}");
        self.exec(&[
            "iptables",
            "-w",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            &addr,
            "-p",
            "tcp",
            "--dport",
            &port,
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ])
    }

    /// Moves the calling thread into this host's network (its sockets, and the threads
    /// and processes it starts from then on, are on the host).
    ///
    /// # Errors
    ///
    /// [`NetError::Io`] if the namespace cannot be opened or entered.
    pub(crate) fn enter(&self) -> Result<(), NetError> {
        let io = |source| NetError::Io {
            host: self.name.clone(),
            what: "entering the host's network",
            source,
        };
        let ns = std::fs::File::open(format!("/run/netns/{}", self.netns)).map_err(io)?;
        nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| io(e.into()))
    }

    /// Runs `f` on a thread that entered this host's namespace.
    fn inside<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, NetError> {
        let path = format!("/run/netns/{}", self.netns);
        let io = |source| NetError::Io {
            host: self.name.clone(),
            what,
            source,
        };
        let joined = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path)?;
            nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            f()
        })
        .join();
        match joined {
            Ok(r) => r.map_err(io),
            Err(_) => Err(io(std::io::Error::other("the thread panicked"))),
        }
    }
}

/// The run's network; dropping it removes every namespace it made (and with them the
/// bridge and the veths). Stop the processes on its hosts first.
#[derive(Debug)]
pub struct Network {
    run: String,
    switch: String,
    hosts: Vec<Host>,
    torn_down: bool,
}

impl Network {
    /// Makes the switch and one host per name. Sweeps the leftovers of runs whose process
    /// is gone first. On any error, what was made is removed again.
    ///
    /// # Errors
    ///
    /// [`NetError::NoPrivilege`] without root, [`NetError::Missing`] without `ip`,
    /// [`NetError::InvalidName`] for a bad or repeated host name, and
    /// [`NetError::Command`] when a step fails.
    pub fn create(names: &[&str]) -> Result<Network, NetError> {
        if names.len() > 250 {
            return Err(NetError::InvalidName(format!("{} hosts", names.len())));
        }
        for (i, n) in names.iter().enumerate() {
            let ok = (1..=12).contains(&n.len())
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            if !ok || names[..i].contains(n) {
                return Err(NetError::InvalidName((*n).to_owned()));
            }
        }
        preflight()?;
        sweep()?;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let run = format!("{PREFIX}{pid}-{n}");
        // A /24 of 10/8 of the run's own; it exists only inside the run's namespaces.
        let (b, c) = (((pid >> 8) & 0xff) as u8, ((pid as u8) ^ (n as u8)));
        let mut net = Network {
            switch: format!("{run}-sw"),
            run,
            hosts: Vec::new(),
            torn_down: false,
        };
        net.build(names, [10, b, c])?;
        Ok(net)
    }

    fn build(&mut self, names: &[&str], net: [u8; 3]) -> Result<(), NetError> {
        run("ip", &["netns", "add", &self.switch])?;
        let sw = self.switch.clone();
        run("ip", &["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &sw, "link", "set", "br0", "up"])?;
        for (i, name) in names.iter().enumerate() {
            let host = Host::new(
                name,
                format!("{}-{name}", self.run),
                Ipv4Addr::new(net[0], net[1], net[2], i as u8 + 2),
            );
            run("ip", &["netns", "add", &host.netns])?;
            self.hosts.push(host.clone());
            let port = format!("p{i}");
            run(
                "ip",
                &[
                    "-n",
                    &sw,
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &host.netns,
                ],
            )?;
            run(
                "ip",
                &["-n", &sw, "link", "set", &port, "master", "br0", "up"],
            )?;
            let cidr = format!("{}/24", host.addr);
            let ns = host.netns.as_str();
            run("ip", &["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
            run("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The run's name (every namespace of it starts with it).
    pub fn run_name(&self) -> &str {
        &self.run
    }

    /// The hosts, in the order they were named.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Removes every namespace of the run; safe to call again.
    ///
    /// # Errors
    ///
    /// [`NetError::Command`] naming the first namespace that could not be removed (the
    /// others are removed anyway).
    pub fn teardown(&mut self) -> Result<(), NetError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        remove_run(&self.run)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::error!(error = %e, run = %self.run, "the run's network was not removed");
        }
    }
}

/// The namespaces of the machine whose names start with `prefix`.
///
/// # Errors
///
/// [`NetError::Command`] if `ip netns list` fails.
pub fn namespaces(prefix: &str) -> Result<Vec<String>, NetError> {
    let out = output("ip", &["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect())
}

/// Removes the namespaces of earlier runs whose process is gone (killed before it could
/// clean up); returns their names. Runs of live processes are left alone.
///
/// # Errors
///
/// [`NetError::Command`] if listing or removing fails.
pub fn sweep() -> Result<Vec<String>, NetError> {
    let mut removed = Vec::new();
    for ns in namespaces(PREFIX)? {
        let pid = ns[PREFIX.len()..].split('-').next().unwrap_or_default();
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            run("ip", &["netns", "delete", &ns])?;
            removed.push(ns);
        }
    }
    Ok(removed)
}

/// Removes every namespace whose name starts with `run-`.
fn remove_run(run: &str) -> Result<(), NetError> {
    let mut first = None;
    for ns in namespaces(&format!("{run}-"))? {
        if let Err(e) = self::run("ip", &["netns", "delete", &ns]) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Fails with the reason when namespaces cannot be made here.
fn preflight() -> Result<(), NetError> {
    let out = Command::new("ip").arg("-V").output();
    if let Err(e) = out {
        return Err(NetError::Missing {
            tool: "ip",
            package: "iproute2",
            reason: e.to_string(),
        });
    }
    let missing =
        missing_capabilities(&std::fs::read_to_string("/proc/self/status").unwrap_or_default());
    if !missing.is_empty() {
        return Err(NetError::NoPrivilege(format!(
            "running as uid {} without {}",
            nix::unistd::geteuid(),
            missing.join(" and ")
        )));
    }
    Ok(())
}

/// The capabilities namespaces need that the effective set (`CapEff:` of
/// `/proc/self/status`, in hex) lacks: `CAP_NET_ADMIN` (bit 12) for the links and
/// firewall rules, `CAP_SYS_ADMIN` (bit 21) to make and enter namespaces.
fn missing_capabilities(status: &str) -> Vec<&'static str> {
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    [(12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN")]
        .into_iter()
        .filter(|(bit, _)| effective & (1 << bit) == 0)
        .map(|(_, name)| name)
        .collect()
}

pub(crate) fn run(program: &str, args: &[&str]) -> Result<(), NetError> {
    output(program, args).map(drop)
}

fn output(program: &str, args: &[&str]) -> Result<String, NetError> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetError::Command {
            command: command.clone(),
            stderr: e.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if stderr.contains("Operation not permitted") || stderr.contains("Permission denied") {
            return Err(NetError::NoPrivilege(format!("`{command}`: {stderr}")));
        }
        Err(NetError::Command { command, stderr })
    }
}

#[cfg(test)]
mod tests {
    use super::missing_capabilities;

    #[test]
    fn the_effective_capabilities_name_what_is_missing() {
        // Root's full set, a set without CAP_NET_ADMIN, and an unprivileged user's.
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(missing_capabilities(root), Vec::<&str>::new());
        let no_net = "CapEff:\t000001ffffffefff\n";
        assert_eq!(missing_capabilities(no_net), ["CAP_NET_ADMIN"]);
        let user = "CapEff:\t0000000000000000\n";
        assert_eq!(
            missing_capabilities(user),
            ["CAP_NET_ADMIN", "CAP_SYS_ADMIN"]
        );
        assert_eq!(
            missing_capabilities("no such line"),
            ["CAP_NET_ADMIN", "CAP_SYS_ADMIN"]
        );
    }
}
