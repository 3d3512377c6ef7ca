//! Check (f): holds a snapshot restore brought back.
//!
//! A restore returns etcd to a snapshot, so every hold key in the snapshot is present
//! again in the restored cluster's revision space, from its first revision until the
//! restored cluster deletes it (the holder releases it, its lease expires, or an admin
//! forces it). Such a hold was granted in an earlier epoch; the epoch is advanced after
//! the restore, so every hold granted in the new space must carry a later one. What must
//! hold, per revision space:
//!
//! - **Exclusion.** In etcd's revision order of the space, a restored hold occupies
//!   `[restored_rev, end_rev)` (open: to the end); no hold of the same lock granted in the
//!   space, and no other restored hold of it, overlaps that interval unless both are
//!   shared ([`Violation::RestoredHoldOverlap`]). The lock core's grant compares the
//!   lock's hold keys, restored ones included, so a grant must wait for the restored key
//!   to go.
//! - **Older epoch.** Every hold granted in the space carries an epoch above the epoch of
//!   every hold the restore brought back into it ([`Violation::RestoredHoldNotOlder`]):
//!   the restored hold belongs to the epoch before the restore, so its token is below
//!   every token granted after it. A hold whose token no worker was handed is left out
//!   of this rule: a locker that has not yet answered from the restored cluster can
//!   have its grant Txn applied there (nothing in a Txn can tell the cluster apart: the
//!   snapshot brought back the epoch key too), sees the new cluster id or a revision
//!   behind in the answer, refuses and deletes the hold; no token was minted, so none
//!   can reach a resource. A hold counts as handed out when a `granted` entry names its
//!   lock, session and token (a hold of a history without sessions always counts).
//!   Exclusion above still covers every hold.
//!
//! Writes carrying a restored hold's token need no rule of their own: the token is below
//! every token of the new epoch, so once a resource has admitted a newer-epoch token,
//! rule (b) ([`Violation::StaleWriteAdmitted`]) holds any later admission of the restored
//! token against it.
//!
//! Memory: the hold intervals of every space after the first (32 bytes a hold) and the
//! restored holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::violation::{HoldRef, Violation};
use crate::history::LockName;

/// A hold of a space, with its epoch and the session its key names.
#[derive(Debug, Clone)]
struct Granted {
    hold: HoldRef,
    epoch: u16,
    session: Option<i64>,
}

/// A restored hold.
#[derive(Debug, Clone)]
struct Back {
    lock: LockName,
    hold: HoldRef,
    epoch: u16,
    restored_rev: i64,
}

#[derive(Debug, Default)]
struct Space {
    granted: HashMap<LockName, Vec<Granted>>,
    restored: Vec<Back>,
}

#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// Spaces after the first (a restore made them), by number.
    spaces: BTreeMap<u32, Space>,
    /// Every token a worker was handed (`granted`), with its lock and session.
    handed_out: HashSet<(LockName, i64, u64)>,
}

impl Restored {
    /// A hold from etcd's history, granted in `space`.
    pub(crate) fn granted(
        &mut self,
        lock: &LockName,
        space: u32,
        epoch: u16,
        session: Option<i64>,
        hold: HoldRef,
    ) {
        if space == 0 {
            // No restore made the first space: nothing was brought back into it.
            return;
        }
        let space = self.spaces.entry(space).or_default();
        space
            .granted
            .entry(lock.clone())
            .or_default()
            .push(Granted {
                hold,
                epoch,
                session,
            });
    }

    /// A token a worker was handed (a `granted` entry).
    pub(crate) fn handed_out(&mut self, lock: &LockName, session: i64, token: u64) {
        self.handed_out.insert((lock.clone(), session, token));
    }

    /// A hold the restore that made `space` brought back.
    pub(crate) fn restored(
        &mut self,
        lock: &LockName,
        space: u32,
        epoch: u16,
        restored_rev: i64,
        hold: HoldRef,
    ) {
        let back = Back {
            lock: lock.clone(),
            hold,
            epoch,
            restored_rev,
        };
        self.spaces.entry(space).or_default().restored.push(back);
    }

    pub(crate) fn finish(self, out: &mut Vec<Violation>) {
        for (number, mut space) in self.spaces {
            for holds in space.granted.values_mut() {
                holds.sort_by_key(|g| (g.hold.grant_rev, g.hold.entry));
            }
            space
                .restored
                .sort_by(|a, b| (&a.lock, a.hold.entry).cmp(&(&b.lock, b.hold.entry)));
            overlaps(number, &space, out);
            epochs(number, &space, &self.handed_out, out);
        }
    }
}

fn end(hold: &HoldRef) -> i64 {
    hold.end_rev.unwrap_or(i64::MAX)
}

/// Exclusion: each restored hold against the holds of its lock granted in the space (the
/// first that overlaps it), and against the other restored holds of its lock.
fn overlaps(number: u32, space: &Space, out: &mut Vec<Violation>) {
    for (i, back) in space.restored.iter().enumerate() {
        let until = end(&back.hold);
        let granted = space
            .granted
            .get(&back.lock)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let first = granted.iter().find(|g| {
            (back.hold.exclusive || g.hold.exclusive)
                && g.hold.grant_rev < until
                && end(&g.hold) > back.restored_rev
        });
        if let Some(g) = first {
            out.push(Violation::RestoredHoldOverlap {
                lock: back.lock.clone(),
                space: number,
                restored: back.hold.clone(),
                restored_rev: back.restored_rev,
                hold: g.hold.clone(),
            });
        }
        // Two restored holds are both present from the space's start.
        for other in &space.restored[i + 1..] {
            if other.lock == back.lock && (back.hold.exclusive || other.hold.exclusive) {
                out.push(Violation::RestoredHoldOverlap {
                    lock: back.lock.clone(),
                    space: number,
                    restored: back.hold.clone(),
                    restored_rev: back.restored_rev,
                    hold: other.hold.clone(),
                });
            }
        }
    }
}

/// Older epoch: every hold granted in the space against the restored hold of the
/// highest epoch, but for holds never handed out (see the module docs).
fn epochs(
    number: u32,
    space: &Space,
    handed_out: &HashSet<(LockName, i64, u64)>,
    out: &mut Vec<Violation>,
) {
    let Some(newest) = space
        .restored
        .iter()
        .max_by_key(|b| (b.epoch, std::cmp::Reverse(b.hold.entry)))
    else {
        return;
    };
    let mut locks: Vec<_> = space.granted.iter().collect();
    locks.sort_by(|a, b| a.0.cmp(b.0));
    for (lock, holds) in locks {
        let refused = |g: &Granted| {
            g.session.is_some_and(|s| {
                let token = (u64::from(g.epoch) << 48) | g.hold.grant_rev as u64;
                !handed_out.contains(&(lock.clone(), s, token))
            })
        };
        for g in holds
            .iter()
            .filter(|g| g.epoch <= newest.epoch && !refused(g))
        {
            out.push(Violation::RestoredHoldNotOlder {
                space: number,
                restored_lock: newest.lock.clone(),
                restored: newest.hold.clone(),
                restored_epoch: newest.epoch,
                lock: lock.clone(),
                hold: g.hold.clone(),
                epoch: g.epoch,
            });
        }
    }
}
