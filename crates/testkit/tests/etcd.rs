//! Tests of the etcd harness itself, against real `etcd` processes. Every test name has
//! `etcd` in it, so nextest runs them one at a time.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use palisade_testkit::{EtcdBinaries, EtcdCluster, RestoreMode};

/// Pids of processes whose command line contains `pattern`.
fn pgrep(pattern: &str) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .expect("pgrep runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The process state letter from `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z` zombie),
/// `None` when the process is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Asserts that no process runs from `dir` and that `pid` is gone (not even a zombie).
fn assert_gone(dir: &Path, pid: u32) {
    let pattern = dir.join("data").display().to_string();
    assert_eq!(
        pgrep(&pattern),
        Vec::<u32>::new(),
        "an etcd process still runs from {pattern}"
    );
    assert_eq!(
        proc_state(pid),
        None,
        "etcd pid {pid} still exists (zombie?)"
    );
    assert!(
        !dir.exists(),
        "member dir {} was not removed",
        dir.display()
    );
}

/// Polls member `i` until its revision reaches `revision`.
async fn wait_revision(cluster: &EtcdCluster, i: usize, revision: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = cluster.status(i).await;
        if status.revision >= revision {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member {i} stuck at revision {} < {revision}",
            status.revision
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn etcd_single_member_serves_put_and_get() {
    let started = Instant::now();
    let cluster = EtcdCluster::single().await;
    eprintln!("single member healthy after {:?}", started.elapsed());
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 1);
    assert!(
        endpoints[0].starts_with("http://127.0.0.1:"),
        "{endpoints:?}"
    );
    assert_eq!(cluster.member_names(), ["m0"]);

    let first = cluster.put("greeting", "hello").await;
    let second = cluster.put("greeting", "hello again").await;
    assert_eq!(second, first + 1);
    assert_eq!(
        cluster.get("greeting").await.as_deref(),
        Some("hello again")
    );
    assert_eq!(cluster.get("missing").await, None);

    let status = cluster.status(0).await;
    assert_eq!(status.member_id, cluster.member_ids()[0]);
    assert_eq!(status.leader, status.member_id);
    assert_eq!(status.revision, second);
    assert_eq!(cluster.cluster_id().await, status.cluster_id);
    assert_eq!(cluster.leader().await, 0);

    // A gRPC client (etcdctl) reaches the same member through the endpoint.
    let out = Command::new(EtcdBinaries::get().etcdctl())
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &endpoints[0],
            "get",
            "greeting",
            "--print-value-only",
        ])
        .output()
        .expect("etcdctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello again");
}

#[tokio::test]
async fn etcd_three_members_survive_leader_kill_and_rejoin() {
    let started = Instant::now();
    let mut cluster = EtcdCluster::start(3).await;
    eprintln!("three members healthy after {:?}", started.elapsed());
    assert_eq!(cluster.member_count(), 3);
    let ids = cluster.member_ids();
    assert!(
        ids.iter().all(|&id| id != 0) && ids[0] != ids[1] && ids[1] != ids[2],
        "{ids:?}"
    );
    let cluster_id = cluster.cluster_id().await;
    for i in 0..3 {
        assert_eq!(cluster.status(i).await.cluster_id, cluster_id);
    }

    let leader = cluster.leader().await;
    let follower = cluster.follower().await;
    assert_ne!(leader, follower);
    cluster.put("k", "before").await;

    let killed = Instant::now();
    cluster.kill(leader);
    assert_eq!(cluster.pid(leader), None);
    let written = cluster.put("k", "after").await;
    eprintln!(
        "write resumed {:?} after the leader was killed",
        killed.elapsed()
    );
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    assert_eq!(cluster.get("k").await.as_deref(), Some("after"));
    assert_eq!(cluster.running_endpoints().len(), 2);

    cluster.restart(leader).await;
    assert!(cluster.pid(leader).is_some());
    wait_revision(&cluster, leader, written).await;
    let status = cluster.status(leader).await;
    assert_eq!(
        status.member_id, ids[leader],
        "a restarted member keeps its id"
    );
    assert_eq!(status.cluster_id, cluster_id);
    assert_ne!(status.leader, 0, "the restarted member sees a leader");
    cluster.put("k", "rejoined").await;
}

#[tokio::test]
async fn etcd_pause_and_resume_members() {
    let mut cluster = EtcdCluster::start(3).await;

    // A paused follower: the other two keep quorum.
    let follower = cluster.follower().await;
    let pid = cluster.pid(follower).unwrap();
    cluster.pause(follower);
    assert_eq!(proc_state(pid), Some('T'), "a paused member is stopped");
    let written = cluster.put("k", "while paused").await;
    cluster.resume(follower);
    assert_ne!(proc_state(pid), Some('T'));
    cluster.wait_healthy_member(follower).await;
    wait_revision(&cluster, follower, written).await;

    // A paused leader: the others elect a new one; once resumed, it follows.
    let leader = cluster.leader().await;
    let old_term = cluster.status(leader).await.raft_term;
    cluster.pause(leader);
    let paused = Instant::now();
    let written = cluster.put("k", "leader paused").await;
    eprintln!(
        "write resumed {:?} after the leader was paused",
        paused.elapsed()
    );
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    assert!(cluster.status(new_leader).await.raft_term > old_term);
    cluster.resume(leader);
    cluster.wait_healthy_member(leader).await;
    wait_revision(&cluster, leader, written).await;
    assert_eq!(cluster.get("k").await.as_deref(), Some("leader paused"));
}

#[tokio::test]
async fn etcd_snapshot_restores_into_a_new_cluster() {
    let cluster = EtcdCluster::single().await;
    let before = cluster.put("before", "1").await;
    let snapshot = cluster.snapshot().await;
    assert_eq!(snapshot.revision(), before);
    assert!(snapshot.path().is_file());
    cluster.put("after", "2").await;

    let restored = EtcdCluster::restore(&snapshot, 3).await;
    assert_eq!(restored.member_count(), 3);
    assert_eq!(restored.get("before").await.as_deref(), Some("1"));
    assert_eq!(restored.get("after").await, None);
    assert_ne!(restored.cluster_id().await, cluster.cluster_id().await);
    assert_ne!(restored.endpoints(), cluster.endpoints());
    assert_eq!(restored.status(0).await.revision, before);
    // Both run side by side; the original still has its later write.
    assert_eq!(cluster.get("after").await.as_deref(), Some("2"));
}

#[tokio::test]
async fn etcd_restore_in_place_keeps_or_changes_the_cluster_id() {
    let mut cluster = EtcdCluster::start(3).await;
    let (endpoints, ids, cluster_id) = (
        cluster.endpoints(),
        cluster.member_ids(),
        cluster.cluster_id().await,
    );
    let before = cluster.put("before", "1").await;
    let snapshot = cluster.snapshot().await;
    let after = cluster.put("after", "2").await;
    assert!(after > before);

    cluster
        .restore_in_place(&snapshot, RestoreMode::SameClusterId)
        .await;
    assert_eq!(cluster.endpoints(), endpoints);
    assert_eq!(cluster.member_ids(), ids);
    assert_eq!(cluster.cluster_id().await, cluster_id);
    assert_eq!(cluster.get("before").await.as_deref(), Some("1"));
    assert_eq!(cluster.get("after").await, None);
    // The revision went backwards under the same cluster id.
    let revision = cluster.status(cluster.leader().await).await.revision;
    assert_eq!(revision, before);
    assert!(revision < after);

    cluster
        .restore_in_place(&snapshot, RestoreMode::NewClusterId)
        .await;
    assert_eq!(cluster.endpoints(), endpoints);
    assert_ne!(cluster.cluster_id().await, cluster_id);
    let new_ids = cluster.member_ids();
    assert!(
        new_ids.iter().all(|id| !ids.contains(id)),
        "{ids:?} vs {new_ids:?}"
    );
    assert_eq!(cluster.get("before").await.as_deref(), Some("1"));
    assert_eq!(cluster.get("after").await, None);
    cluster.put("later", "3").await;
}

#[tokio::test]
async fn etcd_drop_kills_and_reaps_every_member() {
    let mut cluster = EtcdCluster::start(3).await;
    let members: Vec<_> = (0..3)
        .map(|i| (cluster.member_dir(i), cluster.pid(i).unwrap()))
        .collect();
    for (dir, pid) in &members {
        let found = pgrep(&dir.join("data").display().to_string());
        assert_eq!(found, vec![*pid], "pgrep finds member {}", dir.display());
    }
    // A paused and a stopped member are cleaned up too.
    cluster.pause(1);
    cluster.kill(2);
    drop(cluster);
    for (dir, pid) in &members {
        assert_gone(dir, *pid);
    }
}

#[tokio::test]
async fn etcd_members_die_when_a_test_panics() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let cluster = EtcdCluster::single().await;
        tx.send((cluster.member_dir(0), cluster.pid(0).unwrap()))
            .unwrap();
        panic!("a failing test");
    });
    let (dir, pid) = rx.await.expect("the task started a member");
    assert!(task.await.unwrap_err().is_panic());
    assert_gone(&dir, pid);
}

#[tokio::test]
async fn etcd_graceful_stop_hands_over_leadership() {
    let mut cluster = EtcdCluster::start(3).await;
    let leader = cluster.leader().await;
    let stopped = Instant::now();
    cluster.stop(leader).await;
    eprintln!("leader stopped gracefully in {:?}", stopped.elapsed());
    assert_eq!(cluster.pid(leader), None);
    let written = cluster.put("k", "after stop").await;
    eprintln!("write done {:?} after the stop began", stopped.elapsed());
    assert_ne!(cluster.leader().await, leader);
    cluster.restart(leader).await;
    wait_revision(&cluster, leader, written).await;
}

/// Not a test of its own: `etcd_members_die_with_a_killed_test_process` runs it in a child
/// process, which it then kills with SIGKILL.
#[tokio::test]
#[ignore = "helper run by etcd_members_die_with_a_killed_test_process"]
async fn etcd_orphan_probe() {
    let Ok(file) = std::env::var("PALISADE_ETCD_ORPHAN_PROBE") else {
        return;
    };
    let cluster = EtcdCluster::single().await;
    let written = format!("{file}.partial");
    std::fs::write(
        &written,
        format!(
            "{}\n{}",
            cluster.member_dir(0).display(),
            cluster.pid(0).unwrap()
        ),
    )
    .unwrap();
    std::fs::rename(&written, &file).unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[tokio::test]
async fn etcd_members_die_with_a_killed_test_process() {
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = probe_dir.path().join("member");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "etcd_orphan_probe", "--ignored", "--nocapture"])
        .env("PALISADE_ETCD_ORPHAN_PROBE", &probe)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    let text = loop {
        if let Ok(text) = std::fs::read_to_string(&probe) {
            break text;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the probe process did not start a member");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (dir, pid) = text.split_once('\n').unwrap();
    let (dir, pid): (&Path, u32) = (Path::new(dir), pid.parse().unwrap());
    let pattern = dir.join("data").display().to_string();
    assert_eq!(pgrep(&pattern), vec![pid]);

    child.kill().unwrap(); // SIGKILL: no unwinding, no Drop
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Gone, or a zombie of whichever process adopted it: killed either way.
    while !pgrep(&pattern).is_empty() || !matches!(proc_state(pid), None | Some('Z')) {
        assert!(
            Instant::now() < deadline,
            "etcd pid {pid} outlived its killed test process (is util-linux setpriv on PATH?)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nobody removed its temp dir.
    std::fs::remove_dir_all(dir).unwrap();
}
