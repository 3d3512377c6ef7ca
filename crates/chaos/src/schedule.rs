//! The nemesis's plan: which faults, against what, for how long, derived from the seed
//! alone, so that one seed always gives one schedule.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::Duration;

use crate::history::FaultKind;

/// Every fault kind of a loopback run (and of every run), in the history format's order.
pub const ALL_KINDS: [FaultKind; 9] = [
    FaultKind::KillEtcdLeader,
    FaultKind::PauseEtcdMember,
    FaultKind::KillServiceReplica,
    FaultKind::PauseWorker,
    FaultKind::RestartPostgres,
    FaultKind::RestoreEtcdAndAdvanceEpoch,
    FaultKind::ForceRelease,
    FaultKind::LoseReleaseAnswers,
    FaultKind::RehomeNamespace,
];

/// The fault kinds a run on network hosts adds ([`FaultKind::NetemLatency`] too when the
/// kernel has netem).
pub const NET_KINDS: [FaultKind; 7] = [
    FaultKind::PartitionHalves,
    FaultKind::IsolateEtcdLeader,
    FaultKind::SplitMajorityMinority,
    FaultKind::CutWorkerFromLockService,
    FaultKind::DropOneWay,
    FaultKind::RandomLoss,
    FaultKind::ClockJump,
];

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFault {
    /// What to do.
    pub kind: FaultKind,
    /// Quiet time before it starts (after the previous fault healed).
    pub gap: Duration,
    /// How long the fault lasts before it is healed (for a worker pause, on top of the
    /// session TTL).
    pub hold: Duration,
    /// A number that picks the target: the member, replica or worker is `pick % count`
    /// (for a force release, also the pause before the approval: `pick % 1500` ms, and
    /// whether the request names the grant: bit 16).
    pub pick: u32,
    /// For a Postgres restart: crash it (immediate stop) rather than a fast shutdown.
    pub crash: bool,
}

/// The plan for a run with `seed` and the fault `kinds` it can inject: each kind once in a
/// seeded order, then kinds drawn at random, `count` faults in all. Gaps are 1.5–4 s,
/// holds 1.5–4 s; for the network kinds ([`NET_KINDS`], netem) gaps are 0.3–1 s and
/// holds 1–2 s.
pub fn plan(seed: u64, count: usize, kinds: &[FaultKind]) -> Vec<PlannedFault> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut first = kinds.to_vec();
    first.shuffle(&mut rng);
    (0..count)
        .map(|i| {
            let kind = if i < first.len() {
                first[i]
            } else {
                kinds[rng.gen_range(0..kinds.len())]
            };
            let net = NET_KINDS.contains(&kind) || kind == FaultKind::NetemLatency;
            let (gap, hold) = if net {
                ((300..1_000), (1_000..2_000))
            } else {
                ((1_500..4_000), (1_500..4_000))
            };
            PlannedFault {
                kind,
                gap: Duration::from_millis(rng.gen_range(gap)),
                hold: Duration::from_millis(rng.gen_range(hold)),
                pick: rng.gen(),
                crash: rng.gen_bool(0.5),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_plan_and_every_kind_comes_first() {
        let a = plan(42, 20, &ALL_KINDS);
        assert_eq!(a, plan(42, 20, &ALL_KINDS));
        assert_ne!(a, plan(43, 20, &ALL_KINDS), "another seed, another plan");
        let mut first: Vec<FaultKind> = a[..ALL_KINDS.len()].iter().map(|f| f.kind).collect();
        first.sort();
        let mut all = ALL_KINDS.to_vec();
        all.sort();
        assert_eq!(first, all);
        assert!(a
            .iter()
            .all(|f| f.gap >= Duration::from_millis(1_500) && f.hold < Duration::from_secs(4)));
    }

    #[test]
    fn on_hosts_every_network_kind_is_in_the_first_round_and_only_there_on_loopback() {
        let kinds = [&ALL_KINDS[..], &NET_KINDS[..]].concat();
        for seed in [1, 20261130, u64::MAX] {
            let p = plan(seed, 60, &kinds);
            let mut first: Vec<FaultKind> = p[..kinds.len()].iter().map(|f| f.kind).collect();
            first.sort();
            let mut all = kinds.clone();
            all.sort();
            assert_eq!(first, all, "seed {seed}: each kind once, first");
            for f in p.iter().filter(|f| NET_KINDS.contains(&f.kind)) {
                assert!(f.gap < Duration::from_secs(1) && f.hold < Duration::from_secs(2));
            }
            let loopback = plan(seed, 60, &ALL_KINDS);
            assert!(loopback.iter().all(|f| !NET_KINDS.contains(&f.kind)));
        }
    }
}
