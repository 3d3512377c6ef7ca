//! Check (d): epochs only increase, and every grant's token is above every token granted
//! before its acquire began (also across an epoch advance, when etcd's revisions went back).
//! Epoch advances are per tier (one sequence across tiers): a grant is held to the last
//! advance of the tier that granted it.
//!
//! Memory: the acquires in flight (per worker and lock) and the set of granted tokens
//! (eight bytes per grant, to tell a write's token was granted at all).

use std::collections::{HashMap, HashSet};

use super::floor::Floor;
use super::violation::{EntryIndex, EpochRef, GrantRef, Violation};
use crate::history::LockName;

/// Bits of a token that hold the revision (the design's token rule).
const REVISION_BITS: u32 = 48;

/// An acquire in flight and what was known when it began.
#[derive(Debug)]
struct Pending {
    lock: LockName,
    invoked: EntryIndex,
    /// The largest token granted before the acquire began.
    granted_before: Option<GrantRef>,
    /// Per tier (`None`: the home tier), the epoch advanced last there before the
    /// acquire began.
    epoch_before: Vec<(Option<String>, EpochRef)>,
}

#[derive(Debug)]
pub(crate) struct Grants {
    granted: Floor<GrantRef>,
    /// Per tier, its advances.
    epochs: HashMap<Option<String>, Floor<EpochRef>>,
    last_epoch: Option<EpochRef>,
    /// Per worker, its acquires in flight (a worker holds few locks at once).
    pending: HashMap<u32, Vec<Pending>>,
    tokens: HashSet<u64>,
}

impl Grants {
    pub(crate) fn new() -> Self {
        Grants {
            granted: Floor::new(),
            epochs: HashMap::new(),
            last_epoch: None,
            pending: HashMap::new(),
            tokens: HashSet::new(),
        }
    }

    pub(crate) fn acquire(&mut self, index: EntryIndex, at_ns: u64, worker: u32, lock: &LockName) {
        let pending = Pending {
            lock: lock.clone(),
            invoked: index,
            granted_before: self.granted.before(at_ns).map(|(_, g)| g.clone()),
            epoch_before: self
                .epochs
                .iter()
                .filter_map(|(tier, f)| f.before(at_ns).map(|(_, e)| (tier.clone(), *e)))
                .collect(),
        };
        self.pending.entry(worker).or_default().push(pending);
    }

    /// The earliest acquire of `lock` in flight of `worker`. A worker may have two of
    /// one lock in flight (two tasks sharing a session); an answer is matched to the
    /// one that began first, whose floors are the lowest, so no grant is held to what
    /// it cannot have known.
    fn take(&mut self, worker: u32, lock: &LockName) -> Option<Pending> {
        let mine = self.pending.get_mut(&worker)?;
        let at = mine.iter().position(|p| p.lock == *lock)?;
        Some(mine.remove(at))
    }

    pub(crate) fn failed(&mut self, worker: u32, lock: &LockName) {
        self.take(worker, lock);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn granted(
        &mut self,
        index: EntryIndex,
        at_ns: u64,
        worker: u32,
        lock: &LockName,
        token: u64,
        grant_rev: i64,
        tier: Option<&str>,
        out: &mut Vec<Violation>,
    ) {
        let grant = GrantRef {
            entry: index,
            worker,
            token,
        };
        if u64::try_from(grant_rev).ok() != Some(token & ((1 << REVISION_BITS) - 1)) {
            out.push(Violation::TokenNotFromGrant {
                lock: lock.clone(),
                grant: grant.clone(),
                grant_rev,
            });
        }
        match self.take(worker, lock) {
            None => out.push(Violation::GrantWithoutAcquire {
                lock: lock.clone(),
                grant: grant.clone(),
            }),
            Some(p) => {
                let of_tier = p
                    .epoch_before
                    .iter()
                    .find(|(t, _)| t.as_deref() == tier)
                    .map(|(_, e)| *e);
                if let Some(advanced) = of_tier {
                    if token >> REVISION_BITS < u64::from(advanced.epoch) {
                        out.push(Violation::TokenFromOldEpoch {
                            lock: lock.clone(),
                            grant: grant.clone(),
                            acquire: p.invoked,
                            advanced,
                        });
                    }
                }
                if let Some(earlier) = p.granted_before {
                    if token <= earlier.token {
                        out.push(Violation::TokenNotIncreasing {
                            lock: lock.clone(),
                            grant: grant.clone(),
                            acquire: p.invoked,
                            earlier,
                        });
                    }
                }
            }
        }
        self.tokens.insert(token);
        self.granted.record(at_ns, token, grant);
    }

    pub(crate) fn epoch_advanced(
        &mut self,
        index: EntryIndex,
        at_ns: u64,
        epoch: u16,
        tier: Option<&str>,
        out: &mut Vec<Violation>,
    ) {
        let next = EpochRef {
            entry: index,
            epoch,
        };
        if let Some(previous) = self.last_epoch {
            if epoch <= previous.epoch {
                out.push(Violation::EpochNotIncreasing { previous, next });
            }
        }
        self.last_epoch = Some(next);
        self.epochs
            .entry(tier.map(str::to_owned))
            .or_insert_with(Floor::new)
            .record(at_ns, u64::from(epoch), next);
    }

    /// Records a token that etcd's history shows was granted.
    pub(crate) fn etcd_token(&mut self, token: u64) {
        self.tokens.insert(token);
    }

    pub(crate) fn was_granted(&self, token: u64) -> bool {
        self.tokens.contains(&token)
    }
}
