//! Check (j): a hold ends only in a way its holder knows of.
//!
//! A worker handed a hold (`granted`: a 200 to its acquire) counts on it until it lets
//! it go or its client tells it the hold is gone. Each way etcd's history can end a hold
//! has its rule: a force must be told ((g), [`Violation::ForcedHoldNotTold`]); an expiry
//! must be told by the session's deadline ((i), [`Violation::LossSignalLate`]); and a
//! hold etcd's history shows *released* (its key deleted with its grant record, or alone
//! when it had none, and not with its lease's marker) must have been released by its own
//! holder, here: the worker recorded its release (`released`, or `release_unknown`, whose
//! retry may land later) or gave the hold up (`abandoned`), or its client had told it the
//! hold was lost (`lost`, reason `session_ended`, `forced`, or none recorded). Otherwise
//! the hold was deleted on the holder's behalf by someone else, typically another
//! acquire of the same session (a retry after a reset connection, or a second task
//! sharing the session, which took the session's hold for a leftover): the holder keeps
//! its 200, its session lives, the hold is not listed as forced, so nothing ever tells
//! it, and another session is granted the lock while it still writes
//! ([`Violation::HoldEndedUntold`]). A `lost` with reason `not_held` does not count as
//! told: it is the worker finding out afterwards, from its own release refused.
//!
//! A hold is joined to its `granted` entries by lock, token, session and tier, so a hold
//! whose `etcd_hold` names no session (histories written before it was recorded) is
//! outside this rule. Only ends in etcd's history count: a hold still open when its
//! revision space was destroyed by a restore ended with the cluster, not by a delete.
//!
//! Memory: per grant a worker saw, its lock, token, session and tier; per release, loss
//! and abandon, a key; per hold etcd's history shows released, one record. The rule
//! joins them at the end.

use std::collections::{HashMap, HashSet};

use super::violation::{EntryIndex, HoldRef, Violation};
use crate::history::{LockName, LossReason};

#[derive(Debug)]
struct Grant {
    entry: EntryIndex,
    worker: u32,
    session: i64,
    tier: Option<String>,
}

#[derive(Debug)]
struct ReleasedHold {
    lock: LockName,
    token: u64,
    session: i64,
    tier: Option<String>,
    hold: HoldRef,
}

#[derive(Debug, Default)]
pub(crate) struct Untold {
    /// `(lock, token)` -> the `granted` entries that handed it out.
    grants: HashMap<(LockName, u64), Vec<Grant>>,
    /// `(worker, token)` of holds the worker let go or was told it lost.
    known: HashSet<(u32, u64)>,
    /// `(worker, token)` -> its first `lost` with reason `not_held`.
    found_out: HashMap<(u32, u64), EntryIndex>,
    /// Holds etcd's history shows released, with the session their key names.
    released: Vec<ReleasedHold>,
}

impl Untold {
    pub(crate) fn granted(
        &mut self,
        entry: EntryIndex,
        worker: u32,
        lock: &LockName,
        token: u64,
        session: i64,
        tier: Option<&str>,
    ) {
        self.grants
            .entry((lock.clone(), token))
            .or_default()
            .push(Grant {
                entry,
                worker,
                session,
                tier: tier.map(str::to_owned),
            });
    }

    /// The worker let the hold of `token` go: released it (acknowledged or outcome
    /// unknown) or abandoned it.
    pub(crate) fn let_go(&mut self, worker: u32, token: u64) {
        self.known.insert((worker, token));
    }

    /// The worker recorded the hold of `token` lost, for `reason`.
    pub(crate) fn lost(
        &mut self,
        entry: EntryIndex,
        worker: u32,
        token: u64,
        reason: Option<&LossReason>,
    ) {
        match reason {
            Some(LossReason::NotHeld) => {
                self.found_out.entry((worker, token)).or_insert(entry);
            }
            _ => {
                self.known.insert((worker, token));
            }
        }
    }

    /// A hold of etcd's history that ended released.
    pub(crate) fn released(
        &mut self,
        lock: &LockName,
        token: u64,
        session: Option<i64>,
        tier: Option<&str>,
        hold: HoldRef,
    ) {
        let Some(session) = session else { return };
        self.released.push(ReleasedHold {
            lock: lock.clone(),
            token,
            session,
            tier: tier.map(str::to_owned),
            hold,
        });
    }

    pub(crate) fn finish(self, out: &mut Vec<Violation>) {
        for h in &self.released {
            let handed = self
                .grants
                .get(&(h.lock.clone(), h.token))
                .into_iter()
                .flatten()
                .filter(|g| g.session == h.session && g.tier == h.tier);
            for g in handed {
                if self.known.contains(&(g.worker, h.token)) {
                    continue;
                }
                out.push(Violation::HoldEndedUntold {
                    lock: h.lock.clone(),
                    hold: h.hold.clone(),
                    grant: g.entry,
                    worker: g.worker,
                    found_out: self.found_out.get(&(g.worker, h.token)).copied(),
                });
            }
        }
    }
}
