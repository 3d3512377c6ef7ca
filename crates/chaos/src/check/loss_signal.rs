//! Check (i): the loss signal comes in time, and nothing is written with a lost hold.
//!
//! A worker's hold is *open* from its `granted` until the worker's `lost`, `released`,
//! `release_unknown` or `abandoned` of its token, or its next `acquire_invoked` (a worker
//! holds one lock at a time, but for two tasks racing on its session, whose two
//! `acquire_invoked` come before either answer: then both grants are open). The session's *expiry* is the latest `renewed` of the
//! worker's session (`sent_ns + ttl_ms`, on the worker's own monotonic clock): the client
//! counts the session alive until then and must say it is lost when it passes. A hold
//! granted after that (its acquire was answered after the client's expiry) counts from
//! its grant instead.
//!
//! - **Deadline.** While a hold is open, no entry of its worker is recorded later than the
//!   expiry plus [`LOSS_SIGNAL_SLACK`] ([`Violation::LossSignalLate`]), the `lost` itself
//!   included: a late signal is a violation even if fencing stopped the write. A worker
//!   stopped (a `pause_worker` fault naming it in `paused_worker`) across the expiry cannot be told while
//!   stopped: its deadline is the pause's end plus the slack, and none while the pause
//!   has not ended. A history without `renewed` entries of a session is outside this
//!   rule.
//! - **After the signal.** Once a worker recorded `lost` of a token, it invokes no write
//!   carrying that token ([`Violation::WriteAfterLoss`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::violation::{EntryIndex, Violation};
use crate::history::LockName;

/// How late after the session's expiry a worker may be told: scheduling on a loaded
/// machine (the client's timer fires at the expiry; the worker records the signal from
/// another task).
pub const LOSS_SIGNAL_SLACK: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct OpenHold {
    grant: EntryIndex,
    /// When the worker recorded the grant, ns.
    granted_at: u64,
    lock: LockName,
    token: u64,
    session: i64,
}

#[derive(Debug, Default)]
pub(crate) struct LossSignal {
    /// The latest expiry of each (worker, session), in ns.
    expiry: HashMap<(u32, i64), u64>,
    open: HashMap<u32, Vec<OpenHold>>,
    /// Pauses per worker: (start, end when ended).
    pauses: HashMap<u32, Vec<(u64, Option<u64>)>>,
    /// Tokens each worker was told it lost, with the `lost` entry.
    told: HashMap<(u32, u64), EntryIndex>,
    /// (worker, token) already reported late, so one late hold is one violation.
    reported: HashSet<(u32, u64)>,
}

impl LossSignal {
    /// Every entry of `worker` at `at` (before the entry's own effect): an open hold past
    /// its deadline is reported.
    pub(crate) fn entry(
        &mut self,
        index: EntryIndex,
        at: u64,
        worker: u32,
        out: &mut Vec<Violation>,
    ) {
        for hold in self.open.get(&worker).into_iter().flatten() {
            let Some(&expiry) = self.expiry.get(&(worker, hold.session)) else {
                continue;
            };
            // A grant answered after the session's expiry (an acquire long-polling across
            // it) is told within the slack of the grant.
            let Some(deadline) = self.deadline(worker, expiry.max(hold.granted_at)) else {
                continue;
            };
            if at > deadline && self.reported.insert((worker, hold.token)) {
                out.push(Violation::LossSignalLate {
                    lock: hold.lock.clone(),
                    worker,
                    grant: hold.grant,
                    expiry_ns: expiry,
                    deadline_ns: deadline,
                    late: index,
                });
            }
        }
    }

    /// The deadline of a hold whose session expires at `expiry`; `None` while a pause
    /// across it has not ended.
    fn deadline(&self, worker: u32, expiry: u64) -> Option<u64> {
        let slack = LOSS_SIGNAL_SLACK.as_nanos() as u64;
        let mut deadline = expiry.saturating_add(slack);
        for &(start, end) in self.pauses.get(&worker).into_iter().flatten() {
            if start < expiry.saturating_add(slack) {
                match end {
                    None => return None,
                    Some(end) if end > expiry => deadline = deadline.max(end.saturating_add(slack)),
                    Some(_) => {}
                }
            }
        }
        Some(deadline)
    }

    pub(crate) fn renewed(&mut self, worker: u32, session: i64, sent_ns: u64, ttl_ms: u64) {
        let until = sent_ns.saturating_add(ttl_ms.saturating_mul(1_000_000));
        let e = self.expiry.entry((worker, session)).or_insert(until);
        *e = (*e).max(until);
    }

    pub(crate) fn granted(
        &mut self,
        index: EntryIndex,
        at: u64,
        worker: u32,
        lock: &LockName,
        token: u64,
        session: i64,
    ) {
        self.open.entry(worker).or_default().push(OpenHold {
            grant: index,
            granted_at: at,
            lock: lock.clone(),
            token,
            session,
        });
    }

    /// The worker moved on from its hold (a new acquire).
    pub(crate) fn moved_on(&mut self, worker: u32) {
        self.open.remove(&worker);
    }

    /// The worker's hold of `token` ended for it: released, given up, or (`lost`) told.
    pub(crate) fn ended(&mut self, index: EntryIndex, worker: u32, token: u64, told: bool) {
        if let Some(open) = self.open.get_mut(&worker) {
            open.retain(|h| h.token != token);
        }
        if told {
            self.told.entry((worker, token)).or_insert(index);
        }
    }

    pub(crate) fn write_invoked(
        &mut self,
        index: EntryIndex,
        worker: u32,
        token: Option<u64>,
        out: &mut Vec<Violation>,
    ) {
        let Some(token) = token else { return };
        if let Some(&lost) = self.told.get(&(worker, token)) {
            out.push(Violation::WriteAfterLoss {
                worker,
                token,
                lost,
                write: index,
            });
        }
    }

    pub(crate) fn pause(&mut self, worker: u32, at: u64, start: bool) {
        let pauses = self.pauses.entry(worker).or_default();
        if start {
            pauses.push((at, None));
        } else if let Some(open) = pauses.iter_mut().rev().find(|p| p.1.is_none()) {
            open.1 = Some(at);
        }
    }
}
