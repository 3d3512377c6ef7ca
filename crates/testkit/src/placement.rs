//! [`Placement`]: where a process of the kit runs, for callers that put parts on network
//! hosts of their own (network namespaces).

use std::ffi::{OsStr, OsString};
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

/// Where a server process runs: the address it listens on, and the command prefix that
/// runs a program there.
///
/// The default is today's layout: `127.0.0.1`, no prefix (the program runs in the caller's
/// network). A caller with network hosts of its own passes the host's address and a prefix
/// such as `ip netns exec NETNS`; the prefix must run the program in place (`exec`, same
/// process id), so signals and process ids still reach the server. The caller must be
/// able to reach `addr` itself (its thread in the same network).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    addr: IpAddr,
    prefix: Vec<OsString>,
}

impl Default for Placement {
    fn default() -> Placement {
        Placement::loopback()
    }
}

impl Placement {
    /// `127.0.0.1`, no prefix.
    pub fn loopback() -> Placement {
        Placement {
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            prefix: Vec::new(),
        }
    }

    /// Listen on `addr`; run programs as `prefix... program args...`.
    pub fn new(addr: IpAddr, prefix: Vec<OsString>) -> Placement {
        Placement { addr, prefix }
    }

    /// The address servers placed here listen on.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The command prefix (empty for the caller's own network).
    pub fn prefix(&self) -> &[OsString] {
        &self.prefix
    }

    /// A command that runs `program` here.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match self.prefix.split_first() {
            None => Command::new(program),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_goes_before_the_program_and_none_runs_it_directly() {
        let here = Placement::loopback().command("etcd");
        assert_eq!(here.get_program(), "etcd");
        assert_eq!(here.get_args().count(), 0);
        let there = Placement::new(
            IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
            vec!["ip".into(), "netns".into(), "exec".into(), "ns1".into()],
        )
        .command("etcd");
        assert_eq!(there.get_program(), "ip");
        let args: Vec<&OsStr> = there.get_args().collect();
        assert_eq!(args, ["netns", "exec", "ns1", "etcd"]);
    }
}
