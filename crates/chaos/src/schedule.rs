//! The nemesis's plan: which faults, against what, for how long, derived from the seed
//! alone, so that one seed always gives one schedule.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::Duration;

use crate::history::FaultKind;

/// Every fault kind, in the history format's order.
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

/// The plan for a run with `seed`: every kind once in a seeded order, then kinds
/// drawn at random, `count` faults in all. Gaps are 1.5–4 s, holds 1.5–4 s.
pub fn plan(seed: u64, count: usize) -> Vec<PlannedFault> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut first = ALL_KINDS;
    first.shuffle(&mut rng);
    (0..count)
        .map(|i| {
            let kind = if i < first.len() {
                first[i]
            } else {
                ALL_KINDS[rng.gen_range(0..ALL_KINDS.len())]
            };
            PlannedFault {
                kind,
                gap: Duration::from_millis(rng.gen_range(1_500..4_000)),
                hold: Duration::from_millis(rng.gen_range(1_500..4_000)),
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
        let a = plan(42, 20);
        assert_eq!(a, plan(42, 20));
        assert_ne!(a, plan(43, 20), "another seed, another plan");
        let mut first: Vec<FaultKind> = a[..ALL_KINDS.len()].iter().map(|f| f.kind).collect();
        first.sort();
        let mut all = ALL_KINDS.to_vec();
        all.sort();
        assert_eq!(first, all);
        assert!(a
            .iter()
            .all(|f| f.gap >= Duration::from_millis(1_500) && f.hold < Duration::from_secs(4)));
    }
}
