//! The faults of a run on network hosts: cuts, one-way and random loss, netem latency
//! and wall-clock jumps. Each records its start (naming the hosts) and its end (healed).
//!
//! | kind | start | end |
//! |---|---|---|
//! | partition halves | every host (the spare tier's etcd too) into one of two seeded halves, cut both ways | healed after `hold` |
//! | isolate etcd leader | the home tier's member that leads cut from every other host | healed after `hold` |
//! | split majority/minority | the home tier's etcd majority from its minority, replica `pick>>8` on each side, workers by `pick` bits; resource, PostgreSQL and the spare tier's etcd with the majority | healed after `hold` |
//! | cut worker from lock service | worker `pick % workers` from both tiers' etcd and the replicas, not from the resource or PostgreSQL | healed after the TTL plus `hold` |
//! | drop one way | replica `pick % 2` drops what it sends to etcd member `pick>>8 % 3`, or (bit 16) worker `pick>>8 % workers` to replica `pick % 2` | healed after `hold` |
//! | random loss | 20–59 % of one etcd member's (either tier's), replica's or worker's packets dropped (iptables `statistic`) | healed after `hold` |
//! | netem latency | 50–249 ms delay, 20 ms jitter, 0–4 % loss on one such host's link | removed after `hold` |
//! | clock jump | replica `pick % 2`'s wall clock jumps by 60–3659 s, worker `pick>>8 % workers`'s by as much the other way (bit 16 picks which goes forward) | both set back after `hold` |
//!
//! Healing flushes every host's rules, so the next fault starts from a whole network.

use std::time::Duration;

use crate::error::ChaosError;
use crate::history::{FaultKind, Phase};
use crate::layout::Layout;
use crate::net::{sides, Cut, Host, Netem, Network, Roles};
use crate::runner::{Run, TTL};
use crate::schedule::PlannedFault;

fn names(hosts: &[&Host]) -> String {
    hosts.iter().map(|h| h.name()).collect::<Vec<_>>().join(",")
}

/// The hosts a loss or latency fault may pick: etcd members (both tiers), replicas,
/// workers.
fn lossy_candidates<'a>(roles: &Roles<'a>) -> Vec<&'a Host> {
    roles
        .etcd
        .iter()
        .chain(roles.spare)
        .chain(roles.replicas)
        .chain(roles.workers)
        .collect()
}

impl Run {
    /// Injects and heals a fault of the network hosts (none on loopback: never planned).
    pub(super) async fn net_fault(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let layout = self.layout.clone();
        let (Some(net), Some(roles)) = (layout.network(), layout.roles()) else {
            return Ok(());
        };
        let kind = f.kind;
        let cut = match kind {
            FaultKind::PartitionHalves => Some(Cut::Halves),
            FaultKind::IsolateEtcdLeader => Some(Cut::IsolateLeader),
            FaultKind::SplitMajorityMinority => Some(Cut::MajorityMinority),
            FaultKind::CutWorkerFromLockService => Some(Cut::WorkerFromLockService),
            _ => None,
        };
        if let Some(cut) = cut {
            let leader = if cut == Cut::IsolateLeader {
                self.etcd.leader().await
            } else {
                0
            };
            let (a, b) = sides(cut, &roles, f.pick, leader);
            let hold = if cut == Cut::WorkerFromLockService {
                TTL + f.hold
            } else {
                f.hold
            };
            self.fault(
                kind,
                Phase::Start,
                format!(
                    "{} cut from {} for {} ms",
                    names(&a),
                    names(&b),
                    hold.as_millis()
                ),
            );
            blocking(|| net.partition(&a, &b))?;
            return self.heal_after(net, kind, hold).await;
        }
        match kind {
            FaultKind::DropOneWay => {
                let replica = &roles.replicas[f.pick as usize % roles.replicas.len()];
                let (from, to) = if f.pick & (1 << 16) == 0 || roles.workers.is_empty() {
                    (
                        replica,
                        &roles.etcd[(f.pick >> 8) as usize % roles.etcd.len()],
                    )
                } else {
                    (
                        &roles.workers[(f.pick >> 8) as usize % roles.workers.len()],
                        replica,
                    )
                };
                self.fault(
                    kind,
                    Phase::Start,
                    format!(
                        "{} drops what it sends to {} for {} ms",
                        from.name(),
                        to.name(),
                        f.hold.as_millis()
                    ),
                );
                blocking(|| net.drop_one_way(from, to))?;
            }
            FaultKind::RandomLoss => {
                let hosts = lossy_candidates(&roles);
                let host = hosts[f.pick as usize % hosts.len()];
                let percent = 20 + (f.pick >> 8) % 40;
                self.fault(
                    kind,
                    Phase::Start,
                    format!(
                        "{} drops {percent} % of what it sends for {} ms",
                        host.name(),
                        f.hold.as_millis()
                    ),
                );
                blocking(|| net.lossy(host, percent as u8))?;
            }
            FaultKind::NetemLatency => {
                let hosts = lossy_candidates(&roles);
                let host = hosts[f.pick as usize % hosts.len()];
                let netem = Netem {
                    delay: Duration::from_millis(50 + u64::from((f.pick >> 8) % 200)),
                    jitter: Duration::from_millis(20),
                    loss_percent: ((f.pick >> 16) % 5) as u8,
                };
                self.fault(
                    kind,
                    Phase::Start,
                    format!(
                        "{} link: {netem:?} for {} ms",
                        host.name(),
                        f.hold.as_millis()
                    ),
                );
                blocking(|| net.netem(host, netem))?;
            }
            FaultKind::ClockJump => return self.clock_jump(&layout, f).await,
            _ => return Ok(()),
        }
        self.heal_after(net, kind, f.hold).await
    }

    async fn heal_after(
        &self,
        net: &Network,
        kind: FaultKind,
        hold: Duration,
    ) -> Result<(), ChaosError> {
        tokio::time::sleep(hold).await;
        blocking(|| net.heal())?;
        self.fault(kind, Phase::End, "healed".into());
        Ok(())
    }

    async fn clock_jump(&self, layout: &Layout, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = f.kind;
        let replica = Layout::replica_name(f.pick as usize % crate::runner::REPLICAS);
        let workers = self
            .workers
            .as_ref()
            .map_or(1, crate::procs::Workers::count);
        let worker = Layout::worker_name((f.pick >> 8) as usize % workers.max(1));
        let seconds = 60 + i64::from((f.pick >> 17) % 3600);
        let (r, w) = if f.pick & (1 << 16) == 0 {
            (seconds, -seconds)
        } else {
            (-seconds, seconds)
        };
        let (Some(rs), Some(ws)) = (layout.skew(&replica), layout.skew(&worker)) else {
            return Ok(());
        };
        self.fault(
            kind,
            Phase::Start,
            format!(
                "wall clocks: {replica} {r:+} s, {worker} {w:+} s for {} ms",
                f.hold.as_millis()
            ),
        );
        rs.jump(r)?;
        ws.jump(w)?;
        tokio::time::sleep(f.hold).await;
        rs.jump(0)?;
        ws.jump(0)?;
        self.fault(kind, Phase::End, "wall clocks set back".into());
        Ok(())
    }
}

/// Runs `ip`/`iptables` steps (blocking processes) without stalling the run's timers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}
