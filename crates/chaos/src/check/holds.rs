//! Check (c): no two holds of one lock overlap in etcd's revision order within an epoch,
//! unless both are shared.
//!
//! A hold is the half-open revision interval `[grant_rev, end_rev)` of its key (open holds
//! run to infinity). Revisions order holds only within one revision space: a cluster
//! restored from a snapshot numbers its revisions again from the snapshot's, so a hold it
//! grants before the epoch is advanced (one a locker refuses on seeing the restored
//! cluster, and deletes) can share its epoch and its revisions with a hold of the earlier
//! space without the two ever existing in one cluster. Holds are therefore compared per
//! `(lock, epoch, tier, space)` (each tier is a cluster of its own, with its own revisions);
//! how the spaces relate is rules (d) and (f), how the tiers relate rule (i). etcd's history can
//! list holds in any order, so the intervals of each group are kept (32 bytes a hold) and
//! swept once, sorted by grant revision, at the end.

use std::collections::HashMap;

use super::violation::{HoldRef, Violation};
use crate::history::LockName;

#[derive(Debug, Default)]
pub(crate) struct Holds {
    by_lock: HashMap<(LockName, u16, Option<String>, u32), Vec<HoldRef>>,
}

impl Holds {
    pub(crate) fn add(
        &mut self,
        lock: &LockName,
        epoch: u16,
        tier: Option<&str>,
        space: u32,
        hold: HoldRef,
    ) {
        self.by_lock
            .entry((lock.clone(), epoch, tier.map(str::to_owned), space))
            .or_default()
            .push(hold);
    }

    pub(crate) fn finish(self, out: &mut Vec<Violation>) {
        let mut locks: Vec<_> = self.by_lock.into_iter().collect();
        locks.sort_by(|a, b| a.0.cmp(&b.0));
        for ((lock, epoch, _tier, _space), mut holds) in locks {
            holds.sort_by_key(|h| (h.grant_rev, h.entry));
            // The hold reaching farthest so far, among all and among exclusive ones.
            let mut reach_all: Option<&HoldRef> = None;
            let mut reach_x: Option<&HoldRef> = None;
            for hold in &holds {
                let against = if hold.exclusive { reach_all } else { reach_x };
                if let Some(first) = against {
                    if end(first) > hold.grant_rev {
                        out.push(Violation::HoldsOverlap {
                            lock: lock.clone(),
                            epoch,
                            first: first.clone(),
                            second: hold.clone(),
                        });
                    }
                }
                if reach_all.is_none_or(|r| end(hold) > end(r)) {
                    reach_all = Some(hold);
                }
                if hold.exclusive && reach_x.is_none_or(|r| end(hold) > end(r)) {
                    reach_x = Some(hold);
                }
            }
        }
    }
}

fn end(hold: &HoldRef) -> i64 {
    hold.end_rev.unwrap_or(i64::MAX)
}
