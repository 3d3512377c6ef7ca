//! [`EtcdCluster`]: start, stop, pause and inspect etcd members.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::gateway::{self, MemberStatus};
use super::member::{free_ports, Member, State};
use super::EtcdTlsFiles;
use crate::Placement;

/// How long members get to answer `/health` after a start, restart or restore. Generous:
/// the machine may be busy compiling.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`EtcdCluster::leader`], `put`, `get` and `cluster_id` keep trying.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts with fresh ports when another process took a port we picked.
const PORT_ATTEMPTS: u32 = 5;
/// Pause between polls.
const POLL: Duration = Duration::from_millis(50);

static NEXT_TOKEN: AtomicU32 = AtomicU32::new(0);

/// A fresh `--initial-cluster-token`: a new token makes new member and cluster ids.
pub(super) fn new_token() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "palisade-test-{}-{nanos}-{}",
        std::process::id(),
        NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
    )
}

/// Why members did not become healthy.
pub(super) enum Failure {
    /// The member exited and its log says a port was taken.
    PortTaken(usize),
    /// The member exited for another reason.
    Exited(usize, ExitStatus),
    /// These members did not answer `/health` in time.
    Timeout(Vec<usize>),
}

/// One etcd member or a cluster of several, each an `etcd` process with its own temp dir
/// (`data/` and `etcd.log`), listening on `127.0.0.1` client and peer ports picked free
/// (or on addresses of the caller's network hosts: [`EtcdCluster::start_placed`]).
///
/// Members are addressed by index, `0..member_count()`, named `m0`, `m1`, ... Most
/// methods panic with a message that quotes the member's log tail instead of returning
/// errors: this is test support, and a failing harness should fail the test loudly.
///
/// Dropping the cluster kills (SIGKILL, paused members too) and reaps every member
/// process, then removes the temp dirs, also while a panic unwinds. A test process killed
/// outright (SIGKILL, a test timeout) cannot run that; there, members started through
/// util-linux `setpriv --pdeathsig KILL` (used when it is on `PATH`, as on Debian) are
/// killed by the kernel when the thread that started them dies. Their temp dirs stay.
/// So start one cluster per test, from the test's own task: a cluster kept in a `static`
/// and shared by tests dies with the test thread that started it (and a static is never
/// dropped anyway).
///
/// All waits are async (tokio timers, loopback HTTP, `tokio::process`); only killing and
/// reaping a process is a blocking call, and that takes milliseconds.
///
/// # Examples
///
/// ```no_run
/// # async fn example() {
/// use palisade_testkit::{EtcdCluster, RestoreMode};
///
/// let mut cluster = EtcdCluster::start(3).await;
/// let endpoints: Vec<String> = cluster.endpoints(); // ["http://127.0.0.1:41234", ...]
/// let leader = cluster.leader().await;
/// cluster.kill(leader);
/// let revision = cluster.put("k", "v").await; // retries until a new leader takes it
/// cluster.restart(leader).await;
///
/// let snapshot = cluster.snapshot().await;
/// cluster.put("k", "later").await;
/// // Same endpoints, same cluster id, and the revision went back to the snapshot's.
/// cluster.restore_in_place(&snapshot, RestoreMode::SameClusterId).await;
/// assert_eq!(cluster.status(0).await.revision, snapshot.revision());
/// # let _ = (endpoints, revision);
/// # }
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    pub(super) members: Vec<Member>,
    /// `--initial-cluster-token` the members were bootstrapped with.
    pub(super) token: String,
    /// The TLS files, for a cluster started with [`EtcdCluster::start_tls`].
    pub(super) tls: Option<Arc<EtcdTlsFiles>>,
}

impl EtcdCluster {
    /// Starts one member and waits until it is healthy. Same as `start(1)`.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`].
    pub async fn single() -> EtcdCluster {
        EtcdCluster::start(1).await
    }

    /// Starts `members` members as one new cluster (fresh cluster id) and waits until each
    /// answers `GET /health` (it has a leader and serves reads). Ports another process
    /// took in the meantime are replaced, up to 5 attempts.
    ///
    /// # Panics
    ///
    /// If `members` is 0; if `etcd` is not installed (the message names `scripts/test`);
    /// if a member exits or is not healthy within 30 s (the message quotes its log).
    pub async fn start(members: usize) -> EtcdCluster {
        EtcdCluster::launch(&vec![Placement::loopback(); members], None, false).await
    }

    /// Starts `members` members as [`EtcdCluster::start`] does, each also serving
    /// clients over TLS on a port of its own ([`EtcdCluster::tls_endpoints`]): a
    /// certificate from a CA made for this cluster, and every TLS client must show a
    /// certificate chained to that CA (`--client-cert-auth`). The files are at
    /// [`EtcdCluster::tls_files`]. The plain [`EtcdCluster::endpoints`] stay for the
    /// kit's own calls; a test of TLS uses only the TLS ones.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`].
    pub async fn start_tls(members: usize) -> EtcdCluster {
        EtcdCluster::launch(&vec![Placement::loopback(); members], None, true).await
    }

    /// Starts one member per placement, member `i` listening on `placements[i]`'s address
    /// and run through its prefix (say, on a network host of the caller's), as one new
    /// cluster; otherwise as [`EtcdCluster::start`]. The caller must reach those
    /// addresses. Restarts, restores and snapshots keep each member's placement.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::start`].
    pub async fn start_placed(placements: &[Placement]) -> EtcdCluster {
        EtcdCluster::launch(placements, None, false).await
    }

    /// Starts a new cluster of one member per placement; with `seed`, each data dir is
    /// first restored from that snapshot.
    pub(super) async fn launch(
        placements: &[Placement],
        seed: Option<&super::Snapshot>,
        tls: bool,
    ) -> EtcdCluster {
        let members = placements.len();
        assert!(members > 0, "an etcd cluster needs at least one member");
        let files = tls.then(|| {
            let addrs: Vec<_> = placements.iter().map(Placement::addr).collect();
            Arc::new(EtcdTlsFiles::new(&addrs))
        });
        for attempt in 1..=PORT_ATTEMPTS {
            let ports = free_ports(3 * members);
            let members = placements
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let member =
                        Member::new(format!("m{i}"), ports[3 * i], ports[3 * i + 1], p.clone());
                    match &files {
                        Some(files) => member.with_tls(ports[3 * i + 2], files.clone()),
                        None => member,
                    }
                })
                .collect();
            let mut cluster = EtcdCluster {
                members,
                token: new_token(),
                tls: files.clone(),
            };
            if let Some(snapshot) = seed {
                snapshot.restore_into(&cluster, None).await;
            }
            cluster.spawn_all();
            let all: Vec<usize> = (0..cluster.members.len()).collect();
            match cluster.wait_healthy(&all).await {
                Ok(()) => {
                    cluster.learn_ids().await;
                    return cluster;
                }
                Err(Failure::PortTaken(_)) if attempt < PORT_ATTEMPTS => continue,
                Err(failure) => cluster.fail(failure),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    pub(super) fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(super) fn spawn_all(&mut self) {
        let (initial, token) = (self.initial_cluster(), self.token.clone());
        for member in &mut self.members {
            member.spawn(&initial, &token);
        }
    }

    /// Waits until each of `which` answers `/health`.
    pub(super) async fn wait_healthy(&mut self, which: &[usize]) -> Result<(), Failure> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut pending: Vec<usize> = which.to_vec();
        loop {
            let mut still = Vec::new();
            for &i in &pending {
                let member = &mut self.members[i];
                if let Some(status) = member.exited() {
                    return Err(if member.lost_port_race() {
                        Failure::PortTaken(i)
                    } else {
                        Failure::Exited(i, status)
                    });
                }
                if !gateway::healthy(member.client_addr()).await {
                    still.push(i);
                }
            }
            if still.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Failure::Timeout(still));
            }
            pending = still;
            tokio::time::sleep(POLL).await;
        }
    }

    pub(super) fn fail(&self, failure: Failure) -> ! {
        match failure {
            Failure::PortTaken(i) => {
                panic!(
                    "etcd kept losing its ports to other processes; {}",
                    self.members[i].describe()
                )
            }
            Failure::Exited(i, status) => {
                panic!("etcd exited ({status}): {}", self.members[i].describe())
            }
            Failure::Timeout(which) => {
                let described: Vec<String> =
                    which.iter().map(|&i| self.members[i].describe()).collect();
                panic!(
                    "etcd not healthy after {START_TIMEOUT:?}: {}",
                    described.join("\n\n")
                )
            }
        }
    }

    /// Reads member ids from the cluster's member list.
    pub(super) async fn learn_ids(&mut self) {
        let addr = self.members[self.any_running()].client_addr();
        let ids = gateway::member_ids(addr)
            .await
            .unwrap_or_else(|e| panic!("listing etcd members: {e}"));
        for member in &mut self.members {
            member.id = ids
                .iter()
                .find(|(name, _)| *name == member.name)
                .map(|&(_, id)| id)
                .unwrap_or_else(|| {
                    panic!(
                        "member {} missing from the member list {ids:?}",
                        member.name
                    )
                });
        }
    }

    fn any_running(&self) -> usize {
        self.running()
            .next()
            .unwrap_or_else(|| panic!("no etcd member is running (all stopped or paused)"))
    }

    /// Indexes of members that run and are not paused.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(|&i| self.members[i].state() == State::Running)
    }

    fn member(&self, i: usize) -> &Member {
        self.members
            .get(i)
            .unwrap_or_else(|| panic!("no etcd member {i}: the cluster has {}", self.members.len()))
    }

    fn member_mut(&mut self, i: usize) -> &mut Member {
        let len = self.members.len();
        self.members
            .get_mut(i)
            .unwrap_or_else(|| panic!("no etcd member {i}: the cluster has {len}"))
    }

    /// The number of members, running or not.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Client URLs of all members, by index, e.g. `["http://127.0.0.1:41234", ...]`,
    /// stopped and paused members included.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// TLS client URLs of all members, by index, e.g. `["https://127.0.0.1:41236", ...]`,
    /// for a cluster started with [`EtcdCluster::start_tls`].
    ///
    /// # Panics
    ///
    /// If the cluster serves no TLS.
    pub fn tls_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| {
                m.tls_url()
                    .unwrap_or_else(|| panic!("this etcd cluster was not started with TLS"))
            })
            .collect()
    }

    /// The CA, client certificate and key of a cluster started with
    /// [`EtcdCluster::start_tls`].
    ///
    /// # Panics
    ///
    /// If the cluster serves no TLS.
    pub fn tls_files(&self) -> &EtcdTlsFiles {
        self.tls
            .as_deref()
            .unwrap_or_else(|| panic!("this etcd cluster was not started with TLS"))
    }

    /// Client URL of member `i`, e.g. `http://127.0.0.1:41234`.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.member(i).client_url()
    }

    /// The sum of the samples of metric `name` at member `i`'s `/metrics` whose labels
    /// contain `label` (all samples with `""`), e.g. `grpc_server_handled_total` with
    /// `grpc_method="Range"`: etcd's own count of what it served. Read over plain
    /// HTTP/1.0 on the client port.
    ///
    /// # Panics
    ///
    /// If there is no member `i`, or it does not answer.
    pub async fn metric(&self, i: usize, name: &str, label: &str) -> f64 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let url = self.endpoint(i);
        let addr = url.trim_start_matches("http://");
        let mut conn = tokio::net::TcpStream::connect(addr)
            .await
            .expect("member answers");
        conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            .await
            .expect("request sent");
        let mut text = String::new();
        conn.read_to_string(&mut text).await.expect("metrics read");
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter(|l| l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Client URLs of the members that run and are not paused.
    pub fn running_endpoints(&self) -> Vec<String> {
        self.running()
            .map(|i| self.members[i].client_url())
            .collect()
    }

    /// Member names by index: `m0`, `m1`, ...
    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }

    /// Member ids by index, as etcd reports them (`MemberStatus::member_id`).
    pub fn member_ids(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.id).collect()
    }

    /// The member's directory: `data/` (etcd's `--data-dir`) and `etcd.log`. Its path
    /// appears on the member's command line, so `pgrep -f` finds the process by it.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn member_dir(&self, i: usize) -> PathBuf {
        self.member(i).dir().to_owned()
    }

    /// The process id of member `i`, `None` while it is stopped.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.member(i).pid()
    }

    /// The last `lines` lines of member `i`'s log (all its runs).
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        self.member(i).log_tail(lines)
    }

    /// Member `i`'s own view (`/v3/maintenance/status`): ids, leader, revision, term.
    ///
    /// # Panics
    ///
    /// If member `i` does not answer within 2 s (stopped, paused, or failing).
    pub async fn status(&self, i: usize) -> MemberStatus {
        let member = self.member(i);
        gateway::status(member.client_addr())
            .await
            .unwrap_or_else(|e| panic!("status of etcd member {i}: {e}\n{}", member.describe()))
    }

    /// The cluster id, as reported by a running member.
    ///
    /// # Panics
    ///
    /// If no running member answers within 15 s.
    pub async fn cluster_id(&self) -> u64 {
        self.retry("cluster id", |addr| async move {
            gateway::status(addr).await.map(|s| s.cluster_id)
        })
        .await
    }

    /// The index of the leader: the running member that names itself leader at the highest
    /// raft term any running member reports. Waits (polling every 50 ms) while there is
    /// none, e.g. during an election.
    ///
    /// # Panics
    ///
    /// If no running member is leader within 15 s.
    pub async fn leader(&self) -> usize {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let mut best: Option<(u64, usize)> = None;
            let mut seen = Vec::new();
            for i in self.running() {
                match gateway::status(self.members[i].client_addr()).await {
                    Ok(s) => {
                        if s.leader == s.member_id
                            && s.leader != 0
                            && best.is_none_or(|(term, _)| s.raft_term > term)
                        {
                            best = Some((s.raft_term, i));
                        }
                        seen.push(format!("m{i}: {s:?}"));
                    }
                    Err(e) => seen.push(format!("m{i}: {e}")),
                }
            }
            if let Some((_, i)) = best {
                return i;
            }
            if Instant::now() > deadline {
                panic!(
                    "no etcd leader after {SETTLE_TIMEOUT:?}: {}",
                    seen.join("; ")
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The index of a running follower: the lowest running, unpaused index that is not
    /// the leader.
    ///
    /// # Panics
    ///
    /// As [`EtcdCluster::leader`]; or if no other member runs.
    pub async fn follower(&self) -> usize {
        let leader = self.leader().await;
        self.running()
            .find(|&i| i != leader)
            .unwrap_or_else(|| panic!("no running etcd follower: only the leader m{leader} runs"))
    }

    /// Kills member `i` (SIGKILL, as a crash) and reaps it. Its data dir stays, so
    /// [`EtcdCluster::restart`] brings it back. A no-op when it is already stopped.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn kill(&mut self, i: usize) {
        self.member_mut(i).kill();
    }

    /// Stops member `i` gracefully: SIGTERM, up to 10 s to exit (a leader first hands
    /// leadership to a follower), then SIGKILL; reaped either way. Its data dir stays,
    /// so [`EtcdCluster::restart`] brings it back. A no-op when it is already stopped.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub async fn stop(&mut self, i: usize) {
        self.member_mut(i).stop(Duration::from_secs(10)).await;
    }

    /// Starts the stopped member `i` again with its data dir and ports, and waits until it
    /// answers `/health` (it has rejoined and sees a leader).
    ///
    /// # Panics
    ///
    /// If member `i` is running; if it exits or is not healthy within 30 s; if its ports
    /// stay taken by another process.
    pub async fn restart(&mut self, i: usize) {
        // A member that died on its own is reaped here.
        let _ = self.member_mut(i).exited();
        assert!(
            self.members[i].state() == State::Stopped,
            "etcd member {i} is running: kill it first"
        );
        let (initial, token) = (self.initial_cluster(), self.token.clone());
        for attempt in 1..=PORT_ATTEMPTS {
            self.members[i].spawn(&initial, &token);
            match self.wait_healthy(&[i]).await {
                Ok(()) => return,
                Err(Failure::PortTaken(_)) if attempt < PORT_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(failure) => self.fail(failure),
            }
        }
    }

    /// Pauses member `i` with SIGSTOP: it keeps its sockets but answers nothing, as a
    /// process stalled by GC or a VM pause. Returns once the process is stopped (Linux
    /// `/proc` state `T`; a short blocking wait, usually well under a millisecond).
    /// [`EtcdCluster::resume`] continues it.
    ///
    /// # Panics
    ///
    /// If member `i` is not running, the signal fails, or it is not stopped within 5 s.
    pub fn pause(&mut self, i: usize) {
        self.member_mut(i).signal_pause(true);
    }

    /// Continues the paused member `i` (SIGCONT) and returns once it runs again. It does
    /// not wait for the member to catch up; use [`EtcdCluster::wait_healthy_member`] or
    /// poll [`EtcdCluster::status`] for that.
    ///
    /// # Panics
    ///
    /// If member `i` is not running, the signal fails, or it is still stopped after 5 s.
    pub fn resume(&mut self, i: usize) {
        self.member_mut(i).signal_pause(false);
    }

    /// Waits until member `i` answers `/health`.
    ///
    /// # Panics
    ///
    /// If it exits or is not healthy within 30 s.
    pub async fn wait_healthy_member(&mut self, i: usize) {
        let _ = self.member(i);
        if let Err(failure) = self.wait_healthy(&[i]).await {
            self.fail(failure);
        }
    }

    /// Puts `key` = `value` through a running member's JSON gateway (which forwards to the
    /// leader) and returns the revision of the put. Tries the running members in turn
    /// until one succeeds, e.g. while a new leader is elected, for up to 15 s. A put whose
    /// answer was lost may therefore be applied twice (one revision more).
    ///
    /// # Panics
    ///
    /// If no put succeeds within 15 s.
    pub async fn put(&self, key: &str, value: &str) -> i64 {
        self.retry(&format!("put {key:?}"), |addr| async move {
            gateway::put(addr, key, value).await
        })
        .await
    }

    /// Reads `key` with a linearizable range through a running member, retrying like
    /// [`EtcdCluster::put`]. Values are returned as UTF-8 (lossy).
    ///
    /// # Panics
    ///
    /// If no read succeeds within 15 s.
    pub async fn get(&self, key: &str) -> Option<String> {
        self.retry(&format!("get {key:?}"), |addr| async move {
            gateway::get(addr, key).await
        })
        .await
    }

    /// Runs `call` against running members in turn until one succeeds or 15 s pass.
    async fn retry<T, F, Fut>(&self, what: &str, call: F) -> T
    where
        F: Fn(std::net::SocketAddr) -> Fut,
        Fut: std::future::Future<Output = Result<T, gateway::CallError>>,
    {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut last = String::from("no running member");
        loop {
            for i in self.running() {
                match call(self.members[i].client_addr()).await {
                    Ok(value) => return value,
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                panic!("etcd {what}: no success within {SETTLE_TIMEOUT:?}; last error: {last}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
