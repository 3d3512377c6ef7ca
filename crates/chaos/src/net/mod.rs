//! Network hosts for a chaos run, and the faults between them.
//!
//! A [`Network`] puts each part on a host of its own: a network namespace with `eth0` on
//! one bridge (in a switch namespace of the run's), an address from a private /24 that
//! exists only inside the run. Processes run on a host through [`Host::command`]; a
//! socket of this process is bound or connected on a host with [`Host::bind_tcp`] and
//! [`Host::connect_tcp`]. Faults ([`Network::partition`], [`Network::drop_one_way`], [`Network::lossy`],
//! [`Network::netem`], healed by [`Network::heal`]) are iptables rules and qdiscs in
//! the hosts' own namespaces; [`sides`] says which hosts each [`Cut`] separates, from
//! the run's [`Roles`]; [`ClockSkew`] moves the wall clock of processes started
//! with it. Dropping the network removes every namespace it made; [`sweep`] removes
//! those of runs whose process was killed. Without root, [`Network::create`] fails with
//! [`NetError::NoPrivilege`].

mod fault;
mod host;
mod plan;

pub use fault::{ClockSkew, Netem, LIBFAKETIME};
pub use host::{namespaces, sweep, Host, NetError, Network, PREFIX};
pub use plan::{sides, Cut, Roles};
