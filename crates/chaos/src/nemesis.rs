//! The nemesis: carries out one [`PlannedFault`] against the run's real parts and records
//! its start and end.
//!
//! | kind | start | end |
//! |---|---|---|
//! | kill etcd leader | SIGKILL the member that leads | start it again (same data) |
//! | pause etcd member | SIGSTOP member `pick % 3` | SIGCONT |
//! | kill service replica | SIGKILL replica `pick % 2` | start it again (same port) |
//! | pause worker | a worker that holds a lock (`pick % holders`; any worker when none does) stops itself right after recording its next write with a token, before sending it (SIGSTOP from here if it writes nothing within 4.5 s), for the TTL plus `hold` | SIGCONT |
//! | restart Postgres | immediate (crash) or fast stop | start (crash recovery) |
//! | force release | twice: an admin requests a force release of a lock a worker holds (`pick % holders`; by its grant revision or every holder at request time), and a second admin approves it through the other replica, at once, then `pick % 1500` ms later | after `hold` |
//! | lose release answers | worker `pick % workers` is told to have its loopback proxy lose its releases (all of one release's attempts for 1 s, then the answer to one's first attempt, then one's first attempt, in turn) for the TTL plus `hold` | told to stop |
//! | restore etcd | replicas and the leader's followers paused; history read to its end from the leader; every member restored in place from a snapshot taken before the gap, with a new cluster id | replicas resumed; epoch advanced through replica 0, and through each other replica that still refuses grants |

use std::time::Duration;

use nix::sys::signal::Signal;
use palisade_testkit::{RestoreMode, StopMode};
use serde_json::json;

use crate::audit_rows::{self, Replayed};
use crate::error::ChaosError;
use crate::etcd_history::RevisionSpace;
use crate::etcd_history::{self, Head};
use crate::history::{Event, FaultKind, ForceOutcome, Phase};
use crate::procs;
use crate::runner::{epoch_field, retry, Run, ADMIN, ADMIN2, REPLICAS, ROOT, TTL};
use crate::schedule::PlannedFault;
use crate::worker::{LOSE_RELEASES_OFF, LOSE_RELEASES_ON, PAUSE_ARMED_FOR, PAUSE_NEXT_WRITE};
use palisade_api::keys::RootKeys;
use palisade_api::routes;
use palisade_client::ProblemKind;

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
            FaultKind::PauseWorker => {
                let Some(workers) = self.workers.as_ref() else {
                    return Ok(());
                };
                // A worker that holds a lock, when one does.
                let i = self
                    .holding
                    .pick(f.pick)
                    .map_or(f.pick as usize % workers.count(), |(w, _, _)| w as usize);
                let Some(pid) = workers.pid(i) else {
                    return Ok(());
                };
                let pause = TTL + f.hold;
                // The worker stops itself between recording a write and sending it; one
                // that writes nothing in time is stopped from here (its arming has run
                // out by the time it is continued).
                self.tell(i, PAUSE_NEXT_WRITE).await;
                let how = if procs::wait_stopped(pid, PAUSE_ARMED_FOR - Duration::from_millis(500))
                    .await
                {
                    "stopped itself before sending a write"
                } else {
                    procs::signal(pid, Signal::SIGSTOP);
                    "stopped (SIGSTOP)"
                };
                self.fault_on(
                    kind,
                    Phase::Start,
                    format!("worker {i} {how} for {} ms", pause.as_millis()),
                    i,
                );
                tokio::time::sleep(pause).await;
                procs::signal(pid, Signal::SIGCONT);
                self.fault_on(
                    kind,
                    Phase::End,
                    format!("worker {i} continued (SIGCONT)"),
                    i,
                );
            }
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

    /// Two rounds: in each, one admin requests a force release of a lock a worker holds
    /// (by its grant revision, or every holder at request time), and a second admin
    /// approves it through the other replica: at once in the first round, after
    /// `pick % 1500` ms in the second, in which the worker may release and acquire again.
    async fn force_release(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = f.kind;
        let delay = Duration::from_millis(u64::from(f.pick % 1500));
        self.fault(
            kind,
            Phase::Start,
            format!(
                "force releases of held locks, approved at once and {} ms later",
                delay.as_millis()
            ),
        );
        let mut ends = Vec::new();
        for (round, delay) in [Duration::ZERO, delay].into_iter().enumerate() {
            let pick = f.pick.wrapping_add(round as u32);
            ends.push(self.force_one(pick, delay).await?);
        }
        tokio::time::sleep(f.hold).await;
        self.fault(kind, Phase::End, ends.join("; "));
        Ok(())
    }

    /// One force release of the lock of holder `pick % holders`, approved after `delay`;
    /// says what came of it.
    async fn force_one(&mut self, pick: u32, delay: Duration) -> Result<String, ChaosError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        let held = loop {
            match self.holding.pick(pick) {
                Some(h) => break Some(h),
                None if tokio::time::Instant::now() >= deadline => break None,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let Some((worker, lock, token)) = held else {
            return Ok("no worker held a lock".into());
        };
        let by_grant = (pick >> 16) & 1 == 1;
        let grant_rev = token & ((1 << 48) - 1);
        let replica = pick as usize % self.replicas.count();
        let mut body = json!({
            "namespace": lock.ns,
            "class": lock.class,
            "key": lock.key,
            "reason": "chaos: a force release racing the holder",
        });
        if by_grant {
            body["grant_rev"] = json!(grant_rev);
        }
        let requested = self
            .admin_as(replica, ADMIN)?
            .call_json("POST", routes::FORCE_RELEASES, Some(body))
            .await;
        let v = match requested {
            Ok(v) => v,
            Err(e) => {
                return Ok(format!(
                    "{} of worker {worker}: the request was refused: {e}",
                    lock.key
                ))
            }
        };
        let request_id = v["id"].as_str().unwrap_or_default().to_owned();
        self.record(Event::ForceRequested {
            lock: lock.clone(),
            request_id: request_id.clone(),
            targets: revisions(&v["targets"]),
        });
        tokio::time::sleep(delay).await;
        // An approval that fails part way is finished by approving again (it lists the
        // holds the earlier attempt deleted): up to three attempts.
        let approver = self.admin_as((replica + 1) % self.replicas.count(), ADMIN2)?;
        let path = routes::approve_force_release(&request_id);
        let mut outcome = ForceOutcome::Unknown {
            reason: "not approved".into(),
        };
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            outcome = match approver.call_json("POST", &path, None).await {
                Ok(v) => ForceOutcome::Released {
                    grant_revs: revisions(&v["released"]),
                },
                Err(e) if e.problem() == Some(ProblemKind::ForceTargetGone) => {
                    ForceOutcome::TargetGone
                }
                Err(e) => ForceOutcome::Unknown {
                    reason: e.to_string(),
                },
            };
            if !matches!(outcome, ForceOutcome::Unknown { .. }) {
                break;
            }
        }
        let end = format!(
            "{} of worker {worker} (grant {grant_rev}{}), approved after {} ms: {outcome:?}",
            lock.key,
            if by_grant { ", named" } else { "" },
            delay.as_millis()
        );
        self.record(Event::ForceApproved {
            lock,
            request_id,
            outcome,
        });
        Ok(end)
    }

    async fn restore(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = f.kind;
        let Some(snapshot) = self.snapshot.take() else {
            return Ok(());
        };
        self.fault(
            kind,
            Phase::Start,
            format!(
                "etcd restored from the snapshot at revision {}",
                snapshot.revision()
            ),
        );
        // The old cluster's history goes with it: read it to its very end. With the
        // replicas stopped nothing is granted or released; with the leader's followers
        // stopped nothing commits at all (not even a lease expiry), so what the leader
        // has applied is final.
        self.replicas.signal_all(Signal::SIGSTOP);
        let prefix = RootKeys::new(ROOT).locks();
        // Let the audit tailer read the space first, while etcd still has quorum (after a
        // restore its backoff can leave it seconds behind).
        if let Ok(read) = etcd_history::read(
            &self.etcd.endpoints(),
            &prefix,
            self.space.from,
            Head::Linearizable,
            false,
        )
        .await
        {
            let last = read
                .changes
                .last()
                .map_or(0, etcd_history::Change::revision);
            let _ = audit_rows::wait_for_tailer(
                &self.audit_pool,
                read.cluster_id,
                last,
                Duration::from_secs(15),
            )
            .await;
        }
        let leader = self.etcd.leader().await;
        let followers: Vec<usize> = (0..self.etcd.member_count())
            .filter(|i| *i != leader)
            .collect();
        for i in &followers {
            self.etcd.pause(*i);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let endpoint = [self.etcd.endpoint(leader)];
        let read = etcd_history::read(
            &endpoint,
            &prefix,
            self.space.from,
            Head::Serializable,
            true,
        )
        .await;
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                for i in &followers {
                    self.etcd.resume(*i);
                }
                self.replicas.signal_all(Signal::SIGCONT);
                return Err(e);
            }
        };
        let found = etcd_history::holds(&RootKeys::new(ROOT), &read, self.space);
        self.holds.extend(found.holds);
        self.unmatched_ends += found.unmatched_ends;
        // The last few changes (lease expiries since the tailer caught up): the tailer may
        // be watching a stopped follower, and then they are lost with the cluster, as in
        // any restore. The history says how far it got, so that the checker expects rows
        // only of what it could read.
        let last = read
            .changes
            .last()
            .map_or(0, etcd_history::Change::revision);
        let _ = audit_rows::wait_for_tailer(
            &self.audit_pool,
            read.cluster_id,
            last,
            Duration::from_secs(3),
        )
        .await;
        match audit_rows::tailer_through(&self.audit_pool, read.cluster_id).await {
            Ok(through) => self.record(Event::AuditCut {
                space: self.space.number,
                through: through.min(last),
            }),
            // Without it every event of the space must have its row.
            Err(e) => {
                tracing::warn!(error = %e, "the audit position before the restore is unknown")
            }
        }
        self.etcd
            .restore_in_place(&snapshot, RestoreMode::NewClusterId)
            .await;
        let cluster_id = self.etcd.cluster_id().await;
        self.replicas.signal_all(Signal::SIGCONT);

        let mut epoch = self.advance(0).await?;
        for i in 1..REPLICAS {
            // A replica that saw the other cluster id refuses until it is advanced itself.
            let serves = retry(Duration::from_millis(1500), || async {
                match self.epoch_of(i).await? {
                    (e, false) if e == epoch => Ok(()),
                    _ => Err(ChaosError::NotReady(format!(
                        "replica {i} on the new epoch"
                    ))),
                }
            })
            .await;
            if serves.is_err() {
                epoch = self.advance(i).await?;
            }
        }
        self.replayed.push(Replayed {
            cluster_id,
            through: snapshot.revision(),
            epoch,
        });
        self.space = RevisionSpace {
            epoch,
            from: snapshot.revision() + 1,
            number: self.space.number + 1,
        };
        self.fault(
            kind,
            Phase::End,
            format!("etcd cluster {cluster_id:x} serves epoch {epoch}"),
        );
        Ok(())
    }

    /// Advances the epoch through replica `i` (as an operator would after a restore).
    async fn advance(&self, i: usize) -> Result<u16, ChaosError> {
        let admin = self.admin(i)?;
        let v = retry(Duration::from_secs(30), || async {
            admin
                .call_json(
                    "POST",
                    "/v1/epoch/advance",
                    Some(json!({ "reason": "restore" })),
                )
                .await
                .map_err(ChaosError::service("advancing the epoch"))
        })
        .await?;
        let epoch = epoch_field(&v);
        self.record(Event::EpochAdvanced { epoch });
        Ok(epoch)
    }
}

/// The `grant_rev` of each object of a JSON array (force release targets or released
/// holds).
fn revisions(v: &serde_json::Value) -> Vec<i64> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["grant_rev"].as_i64())
        .collect()
}
