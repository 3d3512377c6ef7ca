//! The nemesis: carries out one [`PlannedFault`] against the run's real parts and records
//! its start and end.
//!
//! | kind | start | end |
//! |---|---|---|
//! | kill etcd leader | SIGKILL the member that leads | start it again (same data) |
//! | pause etcd member | SIGSTOP member `pick % 3` | SIGCONT |
//! | kill service replica | SIGKILL replica `pick % 2` | start it again (same port) |
//! | pause worker | a worker that holds a lock (`pick % holders`, up to three tries; any worker when none does) stops itself right after recording its next write with a token, before sending it (SIGSTOP from here on the last try if it writes nothing while armed), for the TTL plus `hold`, and until a write with a higher token has committed on that resource | SIGCONT |
//! | restart Postgres | immediate (crash) or fast stop | start (crash recovery) |
//! | force release | twice: an admin requests a force release of a lock a worker holds (`pick % holders`; by its grant revision or every holder at request time), and a second admin approves it through the other replica, at once, then `pick % 1500` ms later | after `hold` |
//! | lose release answers | worker `pick % workers` is told to have its loopback proxy lose its releases (all of one release's attempts for 1 s, then the answer to one's first attempt, then one's first attempt, in turn) for the TTL plus `hold` | told to stop |
//! | rehome namespace | the workers' namespace moved to the other tier (and back the next time) through replica `pick % 2`, drain `hold` | the move's answer: moved (with the new tier's epoch) or rolled back |
//! | network faults, clock jumps | see `net.rs` | |
//! | restore etcd | replicas and the leader's followers paused; history read to its end from the leader; every member restored in place from a snapshot taken before the gap, with a new cluster id | replicas resumed; epoch advanced through replica 0, and through each other replica that still refuses grants |

use palisade_testkit::StopMode;

use crate::error::ChaosError;
use crate::history::{Event, FaultKind, Phase};
use crate::procs;
use crate::runner::{Run, TTL};
use crate::schedule::PlannedFault;
use crate::worker::{LOSE_RELEASES_OFF, LOSE_RELEASES_ON};

mod force;
mod net;
mod pause;
mod rehome;
mod restore;

impl Run {
    fn fault(&self, kind: FaultKind, phase: Phase, detail: String) {
        self.record(Event::Fault {
            kind,
            phase,
            detail,
            paused_worker: None,
        });
    }

    /// Records a fault that stops worker `worker` (the checker's loss-signal deadline
    /// waits for its end).
    fn fault_on(&self, kind: FaultKind, phase: Phase, detail: String, worker: usize) {
        self.record(Event::Fault {
            kind,
            phase,
            detail,
            paused_worker: u32::try_from(worker).ok(),
        });
    }

    /// Waits the fault's gap, then injects and heals it.
    pub(crate) async fn inject(
        &mut self,
        f: &PlannedFault,
        _next: Option<&PlannedFault>,
    ) -> Result<(), ChaosError> {
        if f.kind == FaultKind::RestoreEtcdAndAdvanceEpoch && self.snapshot.is_none() {
            // Taken before the gap, so the workers move etcd on before it is restored.
            self.snapshot = Some(self.etcd.snapshot().await);
        }
        tokio::time::sleep(f.gap).await;
        let kind = f.kind;
        match kind {
            FaultKind::KillEtcdLeader => {
                let i = self.etcd.leader().await;
                self.fault(
                    kind,
                    Phase::Start,
                    format!("etcd member m{i}, the leader, killed"),
                );
                self.etcd.kill(i);
                tokio::time::sleep(f.hold).await;
                self.etcd.restart(i).await;
                self.fault(kind, Phase::End, format!("etcd member m{i} restarted"));
            }
            FaultKind::PauseEtcdMember => {
                let i = f.pick as usize % self.etcd.member_count();
                self.fault(
                    kind,
                    Phase::Start,
                    format!("etcd member m{i} stopped (SIGSTOP)"),
                );
                self.etcd.pause(i);
                tokio::time::sleep(f.hold).await;
                self.etcd.resume(i);
                self.fault(
                    kind,
                    Phase::End,
                    format!("etcd member m{i} continued (SIGCONT)"),
                );
            }
            FaultKind::KillServiceReplica => {
                let i = f.pick as usize % self.replicas.count();
                self.fault(
                    kind,
                    Phase::Start,
                    format!("lock-service replica {i} killed"),
                );
                self.replicas.kill(i).await;
                tokio::time::sleep(f.hold).await;
                self.replicas.start(i).await?;
                self.fault(
                    kind,
                    Phase::End,
                    format!("lock-service replica {i} started again"),
                );
            }
            FaultKind::PauseWorker => self.pause_worker(f).await?,
            FaultKind::RestartPostgres => {
                let (mode, how) = if f.crash {
                    (StopMode::Immediate, "crashed")
                } else {
                    (StopMode::Fast, "shut down")
                };
                self.fault(kind, Phase::Start, format!("PostgreSQL {how}"));
                self.pg.stop(mode)?;
                tokio::time::sleep(f.hold / 2).await;
                self.pg.start_again().await?;
                self.fault(kind, Phase::End, "PostgreSQL started again".into());
            }
            FaultKind::RestoreEtcdAndAdvanceEpoch => self.restore(f).await?,
            FaultKind::ForceRelease => self.force_release(f).await?,
            FaultKind::RehomeNamespace => self.rehome(f).await?,
            FaultKind::PartitionHalves
            | FaultKind::IsolateEtcdLeader
            | FaultKind::SplitMajorityMinority
            | FaultKind::CutWorkerFromLockService
            | FaultKind::DropOneWay
            | FaultKind::RandomLoss
            | FaultKind::NetemLatency
            | FaultKind::ClockJump => self.net_fault(f).await?,
            FaultKind::LoseReleaseAnswers => {
                let Some(count) = self.workers.as_ref().map(procs::Workers::count) else {
                    return Ok(());
                };
                let i = f.pick as usize % count;
                let window = TTL + f.hold;
                self.fault(
                    kind,
                    Phase::Start,
                    format!(
                        "worker {i}'s proxy loses its releases for {} ms",
                        window.as_millis()
                    ),
                );
                self.tell(i, LOSE_RELEASES_ON).await;
                tokio::time::sleep(window).await;
                self.tell(i, LOSE_RELEASES_OFF).await;
                self.fault(
                    kind,
                    Phase::End,
                    format!("worker {i}'s proxy passes everything"),
                );
            }
        }
        Ok(())
    }

    /// Tells worker `i` a command; a worker that is gone is not told (its exit is
    /// reported when the workers stop).
    async fn tell(&mut self, i: usize, line: &str) {
        if let Some(workers) = self.workers.as_mut() {
            if let Err(e) = workers.tell(i, line).await {
                tracing::warn!(error = %e, worker = i, "a worker could not be told");
            }
        }
    }
}
