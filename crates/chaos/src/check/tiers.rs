//! Check (i): holds of one lock on two tiers, compared by token order and in real time.
//!
//! A rehome moves a namespace to another tier (another etcd cluster): the old tier stops
//! granting in it and drains, the new tier's epoch is advanced above every tier's, and
//! only then does the new tier grant. So, per lock, for two holds on different tiers
//! (`etcd_hold` entries whose `tier` differs):
//!
//! - **Exclusion.** They do not overlap in real time unless both are shared
//!   ([`Violation::TierHoldsOverlap`]).
//! - **Token order.** The one granted after the other ended carries the larger token
//!   ([`Violation::TierTokenNotAbove`]): every token after the move is above every token
//!   before it.
//!
//! Revisions order events of one cluster only; real time comes from the runner's
//! `revision_seen` entries (a linearizable read of one tier's revision, sent at
//! `asked_ns`, answered at the entry's `at_ns`). A change at revision `r` of that tier's
//! space happened before the answer of every mark at or above `r`, and after the sending
//! of every mark below `r`. A rule is broken only when the marks prove it, with strict
//! inequalities between the times: overlap when each hold was granted before the other
//! ended; order when one ended before the other was granted. Where no mark falls between
//! two events, nothing is concluded, so a correct system is never blamed for a race the
//! marks cannot see.
//!
//! An open hold of the live space runs to the end of the history; an open hold of a space
//! a restore destroyed counts as ended after the last mark that saw it. Holds a restore
//! brought back are rule (f)'s, not this one's (their grant is an `etcd_hold` of the
//! space that granted them). Holds of one tier are rule (c)'s.
//!
//! Memory: the marks (24 bytes each) and the holds (about 80 bytes each), until the end;
//! the comparison is per lock, every hold of one tier against every hold of another.

use std::collections::HashMap;

use super::violation::{HoldRef, Violation};
use crate::history::LockName;

/// One revision mark: `revision` was read by a request sent at `asked` and answered at
/// `answered`.
#[derive(Debug, Clone, Copy)]
struct Seen {
    revision: i64,
    asked: u64,
    answered: u64,
}

#[derive(Debug, Clone)]
struct TierHold {
    tier: Option<String>,
    space: u32,
    token: u64,
    hold: HoldRef,
}

/// A hold's place in real time, as far as the marks tell.
#[derive(Debug, Clone, Copy, Default)]
struct Bounds {
    /// The grant happened before this (a mark's answer).
    granted_by: Option<u64>,
    /// The grant happened after this (a mark's sending).
    granted_after: Option<u64>,
    /// The end happened before this.
    ended_by: Option<u64>,
    /// The end happened after this (`u64::MAX`: it never ended).
    ended_after: Option<u64>,
}

/// The marks of one tier's space, sorted by revision, with running extremes.
struct Marks {
    revisions: Vec<i64>,
    /// Largest `asked` of the marks before index `i` (`prefix_asked[i]`).
    prefix_asked: Vec<Option<u64>>,
    /// Smallest `answered` of the marks from index `i` on.
    suffix_answered: Vec<Option<u64>>,
    /// Largest `asked` of the marks from index `i` on.
    suffix_asked: Vec<Option<u64>>,
}

impl Marks {
    fn new(mut seen: Vec<Seen>) -> Marks {
        seen.sort_by_key(|s| s.revision);
        let n = seen.len();
        let mut prefix_asked = vec![None; n + 1];
        for i in 0..n {
            prefix_asked[i + 1] =
                Some(prefix_asked[i].map_or(seen[i].asked, |a: u64| a.max(seen[i].asked)));
        }
        let mut suffix_answered = vec![None; n + 1];
        let mut suffix_asked = vec![None; n + 1];
        for i in (0..n).rev() {
            let s = seen[i];
            suffix_answered[i] =
                Some(suffix_answered[i + 1].map_or(s.answered, |a: u64| a.min(s.answered)));
            suffix_asked[i] = Some(suffix_asked[i + 1].map_or(s.asked, |a: u64| a.max(s.asked)));
        }
        Marks {
            revisions: seen.iter().map(|s| s.revision).collect(),
            prefix_asked,
            suffix_answered,
            suffix_asked,
        }
    }

    /// The index of the first mark at or above `revision`.
    fn at(&self, revision: i64) -> usize {
        self.revisions.partition_point(|r| *r < revision)
    }

    /// A change at `revision` happened before this.
    fn before(&self, revision: i64) -> Option<u64> {
        self.suffix_answered[self.at(revision)]
    }

    /// A change at `revision` happened after this.
    fn after(&self, revision: i64) -> Option<u64> {
        self.prefix_asked[self.at(revision)]
    }

    /// A key created at `revision` and never deleted was present after this.
    fn present_after(&self, revision: i64) -> Option<u64> {
        self.suffix_asked[self.at(revision)]
    }
}

#[derive(Debug, Default)]
pub(crate) struct Tiers {
    seen: HashMap<(Option<String>, u32), Vec<Seen>>,
    holds: HashMap<LockName, Vec<TierHold>>,
}

impl Tiers {
    /// A `revision_seen` entry.
    pub(crate) fn seen(
        &mut self,
        tier: Option<&str>,
        space: u32,
        revision: i64,
        asked: u64,
        answered: u64,
    ) {
        self.seen
            .entry((tier.map(str::to_owned), space))
            .or_default()
            .push(Seen {
                revision,
                asked,
                answered,
            });
    }

    /// An `etcd_hold` entry.
    pub(crate) fn hold(
        &mut self,
        lock: &LockName,
        tier: Option<&str>,
        space: u32,
        token: u64,
        hold: HoldRef,
    ) {
        self.holds.entry(lock.clone()).or_default().push(TierHold {
            tier: tier.map(str::to_owned),
            space,
            token,
            hold,
        });
    }

    pub(crate) fn finish(self, out: &mut Vec<Violation>) {
        let mut last_space: HashMap<&Option<String>, u32> = HashMap::new();
        for (tier, space) in self.seen.keys() {
            let last = last_space.entry(tier).or_default();
            *last = (*last).max(*space);
        }
        for holds in self.holds.values() {
            for h in holds {
                let last = last_space.entry(&h.tier).or_default();
                *last = (*last).max(h.space);
            }
        }
        let marks: HashMap<&(Option<String>, u32), Marks> = self
            .seen
            .iter()
            .map(|(k, v)| (k, Marks::new(v.clone())))
            .collect();
        let bounds = |h: &TierHold| -> Bounds {
            let Some(m) = marks.get(&(h.tier.clone(), h.space)) else {
                return Bounds::default();
            };
            let live = last_space.get(&h.tier).copied().unwrap_or(0) == h.space;
            let (ended_by, ended_after) = match h.hold.end_rev {
                Some(end) => (m.before(end), m.after(end)),
                None if live => (None, Some(u64::MAX)),
                None => (None, m.present_after(h.hold.grant_rev)),
            };
            Bounds {
                granted_by: m.before(h.hold.grant_rev),
                granted_after: m.after(h.hold.grant_rev),
                ended_by,
                ended_after,
            }
        };
        let mut locks: Vec<_> = self.holds.iter().collect();
        locks.sort_by(|a, b| a.0.cmp(b.0));
        for (lock, holds) in locks {
            let mut holds: Vec<(&TierHold, Bounds)> =
                holds.iter().map(|h| (h, bounds(h))).collect();
            holds.sort_by_key(|(h, _)| h.hold.entry);
            for (i, (a, ab)) in holds.iter().enumerate() {
                for (b, bb) in &holds[i + 1..] {
                    if a.tier == b.tier {
                        continue;
                    }
                    let overlap = (a.hold.exclusive || b.hold.exclusive)
                        && earlier(bb.granted_by, ab.ended_after)
                        && earlier(ab.granted_by, bb.ended_after);
                    if overlap {
                        out.push(Violation::TierHoldsOverlap {
                            lock: lock.clone(),
                            first: a.hold.clone(),
                            first_tier: a.tier.clone(),
                            second: b.hold.clone(),
                            second_tier: b.tier.clone(),
                        });
                    }
                    for ((x, xb), (y, yb)) in [((a, ab), (b, bb)), ((b, bb), (a, ab))] {
                        if earlier(xb.ended_by, yb.granted_after) && y.token <= x.token {
                            out.push(Violation::TierTokenNotAbove {
                                lock: lock.clone(),
                                earlier: x.hold.clone(),
                                earlier_tier: x.tier.clone(),
                                earlier_token: x.token,
                                later: y.hold.clone(),
                                later_tier: y.tier.clone(),
                                later_token: y.token,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// Whether `a` is known and strictly before `b`.
fn earlier(a: Option<u64>, b: Option<u64>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a < b)
}
