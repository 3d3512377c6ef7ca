//! Where each part of a run runs: on network hosts of its own (the default), or all on
//! loopback (`--loopback`).
//!
//! On hosts ([`crate::net::Network`]), each etcd member of the home tier (`etcd0`..),
//! the spare tier's one member (`spare0`), each replica (`svc0`, `svc1`), PostgreSQL
//! (`pg`) and each worker (`worker0`..) has a host, and the resource service has
//! `resource`, which it shares with the runner's own connections (the audit tailers of
//! both tiers, the revision marks, the nemesis's admin calls and etcd reads): the run's
//! thread enters that host before it starts anything. Servers listen on their host's
//! address.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use palisade_testkit::Placement;

use crate::error::ChaosError;
use crate::net::{ClockSkew, Host, NetError, Netem, Network, Roles};
use crate::runner::{ETCD_MEMBERS, REPLICAS, SPARE_MEMBERS};

/// The port replicas listen on, on hosts: on `127.0.0.1` inside their host (dev mode
/// serves loopback only), reached at the host's address through
/// [`Host::forward_to_loopback`].
pub(crate) const REPLICA_PORT: u16 = 7070;

/// Where a replica or worker process runs, and the wall clock it sees (on hosts).
#[derive(Debug, Clone, Default)]
pub(crate) struct Place {
    pub(crate) placement: Placement,
    pub(crate) skew: Option<ClockSkew>,
}

/// The run's layout; dropping it removes the network (stop the processes first).
pub(crate) struct Layout {
    network: Option<Network>,
    etcd: Vec<Host>,
    /// The spare tier's etcd member.
    spare: Vec<Host>,
    replicas: Vec<Host>,
    workers: Vec<Host>,
    /// The resource service's (and the runner's) host, then PostgreSQL's.
    resources: Vec<Host>,
    /// The wall clocks of the replicas and workers, by host name, in files of `clocks`.
    skews: BTreeMap<String, ClockSkew>,
    _clocks: Option<tempfile::TempDir>,
    /// Whether the kernel has netem (`Err`: why not).
    pub(crate) netem: Result<(), String>,
}

impl Layout {
    /// Everything on loopback, as before hosts existed.
    pub(crate) fn loopback() -> Layout {
        Layout {
            network: None,
            etcd: Vec::new(),
            spare: Vec::new(),
            replicas: Vec::new(),
            workers: Vec::new(),
            resources: Vec::new(),
            skews: BTreeMap::new(),
            _clocks: None,
            netem: Err("a loopback run has no network faults".into()),
        }
    }

    /// One host per part, for `workers` workers.
    ///
    /// # Errors
    ///
    /// [`ChaosError::Net`]: [`crate::net::NetError::NoPrivilege`] without
    /// `CAP_NET_ADMIN` and `CAP_SYS_ADMIN` (it names them and suggests `--loopback`), or
    /// a failed step.
    pub(crate) fn hosts(workers: u32) -> Result<Layout, ChaosError> {
        let mut names: Vec<String> = Vec::new();
        names.extend((0..ETCD_MEMBERS).map(|i| format!("etcd{i}")));
        names.extend((0..SPARE_MEMBERS).map(|i| format!("spare{i}")));
        names.extend((0..REPLICAS).map(|i| format!("svc{i}")));
        names.extend((0..workers).map(|i| format!("worker{i}")));
        names.extend(["resource".to_owned(), "pg".to_owned()]);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let network = Network::create(&refs)?;
        let pick = |prefix: &str| -> Vec<Host> {
            network
                .hosts()
                .iter()
                .filter(|h| {
                    h.name()
                        .strip_prefix(prefix)
                        .is_some_and(|n| n.is_empty() || n.bytes().all(|b| b.is_ascii_digit()))
                })
                .cloned()
                .collect()
        };
        let (etcd, spare) = (pick("etcd"), pick("spare"));
        let (replicas, worker_hosts) = (pick("svc"), pick("worker"));
        let resources = [pick("resource"), pick("pg")].concat();
        let clocks = tempfile::Builder::new()
            .prefix("palisade-chaos-clocks-")
            .tempdir()
            .map_err(ChaosError::io("creating the clock offsets' directory"))?;
        let mut skews = BTreeMap::new();
        for h in replicas.iter().chain(&worker_hosts) {
            let file = clocks.path().join(format!("{}.offset", h.name()));
            skews.insert(h.name().to_owned(), ClockSkew::new(&file)?);
        }
        for h in &replicas {
            h.forward_to_loopback(REPLICA_PORT)?;
        }
        let netem = probe_netem(&network);
        Ok(Layout {
            network: Some(network),
            etcd,
            spare,
            replicas,
            workers: worker_hosts,
            resources,
            skews,
            _clocks: Some(clocks),
            netem,
        })
    }

    /// The wall clock of replica or worker host `name` (`svc0`, `worker1`), on hosts.
    pub(crate) fn skew(&self, name: &str) -> Option<&ClockSkew> {
        self.skews.get(name)
    }

    /// What a loopback run or a kernel without netem leaves out, for the summary.
    pub(crate) fn notes(&self) -> Vec<String> {
        match (&self.network, &self.netem) {
            (None, _) => vec![
                "network: loopback (--loopback); network faults and clock jumps not planned"
                    .to_owned(),
            ],
            (Some(n), Ok(())) => vec![format!("network: {} hosts", n.hosts().len())],
            (Some(n), Err(why)) => vec![
                format!("network: {} hosts", n.hosts().len()),
                format!("netem_latency not planned: {why}"),
            ],
        }
    }

    /// The network, when the run has hosts.
    pub(crate) fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// The hosts by role, when the run has hosts.
    pub(crate) fn roles(&self) -> Option<Roles<'_>> {
        self.network.as_ref().map(|_| Roles {
            etcd: &self.etcd,
            spare: &self.spare,
            replicas: &self.replicas,
            workers: &self.workers,
            resources: &self.resources,
        })
    }

    /// The host the run's thread enters (the resource service's), when the run has hosts.
    pub(crate) fn runner(&self) -> Option<Host> {
        self.resources.first().cloned()
    }

    /// Where etcd member `i` of the home tier runs.
    pub(crate) fn etcd(&self, i: usize) -> Placement {
        placement(self.etcd.get(i))
    }

    /// Where etcd member `i` of the spare tier runs.
    pub(crate) fn spare_etcd(&self, i: usize) -> Placement {
        placement(self.spare.get(i))
    }

    /// The host names of replica `i` and worker `i` (the keys of [`Layout::skew`]).
    pub(crate) fn replica_name(i: usize) -> String {
        format!("svc{i}")
    }

    /// See [`Layout::replica_name`].
    pub(crate) fn worker_name(i: usize) -> String {
        format!("worker{i}")
    }

    /// Where replica `i` runs, and its wall clock.
    pub(crate) fn replica(&self, i: usize) -> Place {
        Place {
            placement: placement(self.replicas.get(i)),
            skew: self.skew(&Layout::replica_name(i)).cloned(),
        }
    }

    /// Where worker `i` runs, and its wall clock.
    pub(crate) fn worker(&self, i: usize) -> Place {
        Place {
            placement: placement(self.workers.get(i)),
            skew: self.skew(&Layout::worker_name(i)).cloned(),
        }
    }

    /// Where PostgreSQL runs.
    pub(crate) fn pg(&self) -> Placement {
        placement(self.resources.get(1))
    }

    /// The address the resource service listens on.
    pub(crate) fn resource_addr(&self) -> IpAddr {
        self.resources
            .first()
            .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |h| IpAddr::V4(h.addr()))
    }
}

/// Whether `tc netem` works here: tried once on the first host, then removed.
fn probe_netem(network: &Network) -> Result<(), String> {
    let Some(host) = network.hosts().first() else {
        return Err("no host".into());
    };
    let tried = network.netem(
        host,
        Netem {
            delay: Duration::from_millis(1),
            jitter: Duration::ZERO,
            loss_percent: 0,
        },
    );
    let _ = network.heal();
    tried.map_err(|e| match e {
        NetError::Missing { tool, reason, .. } => format!("the kernel has no {tool} ({reason})"),
        e => e.to_string(),
    })
}

impl Drop for Layout {
    fn drop(&mut self) {
        // The processes are gone by now (their parts were dropped first).
        for skew in self.skews.values() {
            skew.remove_leftovers();
        }
    }
}

/// A host's placement (`ip netns exec NETNS`, which runs the program in place); loopback
/// without one.
fn placement(host: Option<&Host>) -> Placement {
    match host {
        None => Placement::loopback(),
        Some(h) => Placement::new(
            IpAddr::V4(h.addr()),
            ["ip", "netns", "exec", h.netns()]
                .into_iter()
                .map(OsString::from)
                .collect(),
        ),
    }
}
