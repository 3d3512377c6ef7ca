//! Real etcd members for tests: one member or a cluster of several, each a process of the
//! `etcd` binary in a temp dir of its own, on free 127.0.0.1 ports.
//!
//! - Which `etcd`: the one `PALISADE_ETCD` names, else the one on `PATH` (Debian 12's
//!   etcd 3.4); `etcdctl` and `etcdutl` come from the same directory ([`EtcdBinaries`]).
//!   The kit runs etcd 3.4 and 3.5 alike; [`EtcdBinaries::version`] tells them apart.
//!
//! - [`EtcdCluster`] starts members and waits until each answers `GET /health`; it kills,
//!   restarts, pauses (SIGSTOP) and resumes members by index, finds the leader, and takes
//!   and restores snapshots ([`Snapshot`], [`RestoreMode`]).
//! - [`EtcdCluster::start_tls`] starts members that also serve clients over TLS with
//!   client-certificate auth ([`EtcdCluster::tls_endpoints`], [`EtcdTlsFiles`]).
//! - Every process is killed (SIGKILL) and reaped when the cluster is dropped, also while
//!   a test panics; the temp dirs are removed afterwards.
//! - Small helpers talk to etcd's JSON gateway (`/v3/...`), so the kit needs no etcd
//!   client: [`EtcdCluster::put`], [`EtcdCluster::get`], [`EtcdCluster::status`].
//! - Each member logs (etcd's zap JSON lines, level info) to `etcd.log` in its dir; panics
//!   about a member quote the tail of that log. [`EtcdCluster::log_tail`] gives it too.
//!
//! Snapshots are saved with `etcdctl` (`ETCDCTL_API=3`) and restored and inspected with
//! `etcdutl` from etcd 3.5 on (`etcdctl` before). A missing binary panics with a message
//! naming `scripts/test`, which installs them.
//!
//! Tests that start members should have `etcd` in their name: the nextest config runs
//! those one at a time.

mod binary;
mod cluster;
mod gateway;
mod member;
mod snapshot;
mod tls;

pub use binary::{EtcdBinaries, EtcdVersion, LocateError, ETCD_VARIABLE};
pub use cluster::EtcdCluster;
pub use gateway::MemberStatus;
pub use snapshot::{BumpUnsupported, RestoreMode, Snapshot};
pub use tls::EtcdTlsFiles;

/// Panics for a binary that could not be spawned, naming `scripts/test` when it is missing.
fn binary_missing(binary: &std::path::Path, error: &std::io::Error) -> ! {
    let binary = binary.display();
    if error.kind() == std::io::ErrorKind::NotFound {
        panic!(
            "`{binary}` was not found ({error}): run scripts/test, which installs \
             etcd-server and etcd-client"
        );
    }
    panic!("could not start `{binary}`: {error}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_panics_naming_scripts_test() {
        let error = std::process::Command::new("palisade-no-such-etcd-binary")
            .spawn()
            .unwrap_err();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            binary_missing(std::path::Path::new("/opt/etcd/etcdctl"), &error)
        }))
        .unwrap_err();
        let message = panic
            .downcast_ref::<String>()
            .expect("a formatted panic message");
        assert!(message.contains("scripts/test"), "{message}");
        assert!(
            message.contains("`/opt/etcd/etcdctl` was not found"),
            "{message}"
        );
    }
}
