//! Snapshots: `etcdctl snapshot save`, and restores into a new cluster or in place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::cluster::{new_token, EtcdCluster};
use super::{binary_missing, EtcdBinaries, EtcdVersion};

/// Longest wait for one `etcdctl` run.
const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(30);

/// A snapshot file taken with `etcdctl snapshot save`, kept in a temp dir of its own
/// (removed on drop). It outlives the cluster it was taken from.
#[derive(Debug)]
pub struct Snapshot {
    dir: TempDir,
    revision: i64,
}

/// A restore that raises the revision asked of an etcd that cannot
/// ([`EtcdCluster::restore_in_place_bumped`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "etcd {version} cannot raise the revision on restore: `etcdutl snapshot restore \
     --bump-revision` comes with etcd 3.5"
)]
pub struct BumpUnsupported {
    /// The release in use.
    pub version: EtcdVersion,
}

/// Which identity a restore in place gives the cluster ([`EtcdCluster::restore_in_place`]).
///
/// etcd derives member ids from the peer URLs and `--initial-cluster-token`, and the
/// cluster id from the member ids; the data (keys, revision) come from the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestoreMode {
    /// Same member names, peer URLs and token: the same member ids and cluster id as
    /// before, with the snapshot's (older) revision. A client cannot tell by the ids that
    /// the revision went backwards.
    SameClusterId,
    /// Same names and URLs, a fresh token: new member ids and a new cluster id.
    NewClusterId,
}

impl Snapshot {
    /// The snapshot file (etcd's bbolt database format).
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("snapshot.db")
    }

    /// The store revision the snapshot holds (`etcdctl snapshot status`).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Writes every member's data dir of `cluster` from this snapshot, with the cluster's
    /// names, peer URLs and token; with `bump`, the revision raised by that much and
    /// marked compacted (etcd 3.5's `etcdutl`). The members must be stopped.
    pub(super) async fn restore_into(&self, cluster: &EtcdCluster, bump: Option<u64>) {
        let initial = cluster.initial_cluster();
        for member in &cluster.members {
            let data = member.data_dir();
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .unwrap_or_else(|e| panic!("removing {}: {e}", data.display()));
            }
            let mut args = vec![
                "snapshot".to_owned(),
                "restore".to_owned(),
                self.path().display().to_string(),
                format!("--name={}", member.name),
                format!("--data-dir={}", data.display()),
                format!("--initial-cluster={initial}"),
                format!("--initial-cluster-token={}", cluster.token),
                format!("--initial-advertise-peer-urls={}", member.peer_url()),
            ];
            if let Some(bump) = bump {
                args.extend([
                    format!("--bump-revision={bump}"),
                    "--mark-compacted".to_owned(),
                ]);
            }
            offline_snapshot_tool(&args).await;
        }
    }
}

impl EtcdCluster {
    /// Saves a snapshot from the leader (`etcdctl snapshot save`).
    ///
    /// # Panics
    ///
    /// If there is no leader within 15 s, or `etcdctl` fails or is missing (the message
    /// names `scripts/test`).
    pub async fn snapshot(&self) -> Snapshot {
        let leader = self.leader().await;
        let dir = tempfile::Builder::new()
            .prefix("palisade-etcd-snapshot-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temp dir for an etcd snapshot: {e}"));
        let path = dir.path().join("snapshot.db");
        etcdctl(&[
            format!("--endpoints={}", self.endpoint(leader)),
            "snapshot".to_owned(),
            "save".to_owned(),
            path.display().to_string(),
        ])
        .await;
        let revision = snapshot_revision(&path).await;
        Snapshot { dir, revision }
    }

    /// Starts a new cluster of `members` members from `snapshot`: new ports, a new token,
    /// so new member ids and a new cluster id; the keys and revision of the snapshot.
    /// Waits until every member is healthy.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`]; or if `etcdctl snapshot restore` fails.
    pub async fn restore(snapshot: &Snapshot, members: usize) -> EtcdCluster {
        EtcdCluster::launch(
            &vec![crate::Placement::loopback(); members],
            Some(snapshot),
            false,
        )
        .await
    }

    /// Replaces this cluster's data with `snapshot` on the same ports: kills every member,
    /// restores each data dir with the same member names and peer URLs (and, for
    /// [`RestoreMode::SameClusterId`], the same token), starts them again and waits until
    /// each is healthy. Clients keep their endpoints; what they see changes as `mode` says.
    ///
    /// # Panics
    ///
    /// If `etcdctl snapshot restore` fails; if a member exits or is not healthy within
    /// 30 s; if another process took one of the cluster's ports meanwhile.
    pub async fn restore_in_place(&mut self, snapshot: &Snapshot, mode: RestoreMode) {
        self.restore_in_place_inner(snapshot, mode, None).await;
    }

    /// [`restore_in_place`](Self::restore_in_place) with the revision raised by `bump`
    /// past the snapshot's and the new revision marked compacted (etcd 3.5's `etcdutl
    /// snapshot restore --bump-revision <bump> --mark-compacted`): with a bump at least
    /// the number of revisions written since the snapshot, no revision the cluster
    /// served before is served again for other data, and a watch or read at a revision
    /// below the new one fails as compacted instead of seeing the restored history.
    ///
    /// # Errors
    ///
    /// [`BumpUnsupported`], before anything is stopped, when the etcd in use is older
    /// than 3.5 (`etcdctl snapshot restore` has no such option).
    ///
    /// # Panics
    ///
    /// As [`restore_in_place`](Self::restore_in_place).
    pub async fn restore_in_place_bumped(
        &mut self,
        snapshot: &Snapshot,
        mode: RestoreMode,
        bump: u64,
    ) -> Result<(), BumpUnsupported> {
        let version = EtcdBinaries::get().version();
        if !version.at_least(3, 5) {
            return Err(BumpUnsupported { version });
        }
        self.restore_in_place_inner(snapshot, mode, Some(bump))
            .await;
        Ok(())
    }

    async fn restore_in_place_inner(
        &mut self,
        snapshot: &Snapshot,
        mode: RestoreMode,
        bump: Option<u64>,
    ) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if mode == RestoreMode::NewClusterId {
            self.token = new_token();
        }
        snapshot.restore_into(self, bump).await;
        self.spawn_all();
        let all: Vec<usize> = (0..self.members.len()).collect();
        if let Err(failure) = self.wait_healthy(&all).await {
            self.fail(failure);
        }
        self.learn_ids().await;
    }
}

/// Runs `etcdctl` with `ETCDCTL_API=3`; its stdout.
async fn etcdctl(args: &[String]) -> String {
    run_tool(&EtcdBinaries::get().etcdctl(), args).await
}

/// Runs the tool for offline snapshot commands (`snapshot restore`, `snapshot status`):
/// `etcdutl` from etcd 3.5 on, where `etcdctl`'s are deprecated, else `etcdctl`.
async fn offline_snapshot_tool(args: &[String]) -> String {
    let binaries = EtcdBinaries::get();
    let tool = binaries.etcdutl().unwrap_or_else(|| binaries.etcdctl());
    run_tool(&tool, args).await
}

/// Runs `tool` with `ETCDCTL_API=3`; its stdout.
async fn run_tool(tool: &Path, args: &[String]) -> String {
    let mut command = tokio::process::Command::new(tool);
    command
        .env("ETCDCTL_API", "3")
        .args(args)
        .kill_on_drop(true);
    let output = match tokio::time::timeout(ETCDCTL_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => binary_missing(tool, &e),
        Err(_) => panic!(
            "{} {} did not finish within {ETCDCTL_TIMEOUT:?}",
            tool.display(),
            args.join(" ")
        ),
    };
    assert!(
        output.status.success(),
        "{} {} failed ({}):\n{}{}",
        tool.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `snapshot status -w json`: `{"hash":..,"revision":..,"totalKey":..,"totalSize":..}`.
async fn snapshot_revision(path: &Path) -> i64 {
    let out = offline_snapshot_tool(&[
        "snapshot".to_owned(),
        "status".to_owned(),
        path.display().to_string(),
        "--write-out=json".to_owned(),
    ])
    .await;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("snapshot status: {e}: {out}"));
    v["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no revision in snapshot status: {out}"))
}
