//! Check (h): a release a worker saw succeed, or one reported outcome-unknown, ends its
//! hold while the session lives on.
//!
//! A release names its hold by lock and token; etcd's history shows the hold
//! (`etcd_hold`, with its session and end). The session lives on when it is granted
//! another hold later; the released hold must not still be held then. For a release the
//! service acknowledged, that is immediate: the worker acquires again only after the
//! answer. For an outcome-unknown release the client goes on sending it in the
//! background, so the next grant may come first; the hold must then end by that release
//! (or a force), never linger until the session expires or the history ends. An open
//! hold of a revision space a restore destroyed is left out: the restore, not the
//! release, decided its end.
//!
//! Memory: per hold of etcd's history with a session, one record (and its grant revision
//! under its session); per release, one record. The rule joins them at the end.

use std::collections::HashMap;

use super::violation::{EntryIndex, Violation};
use crate::history::{HoldEnd, LockName};

#[derive(Debug)]
struct Release {
    entry: EntryIndex,
    lock: LockName,
    token: u64,
    unknown: bool,
}

#[derive(Debug, Clone)]
struct Hold {
    entry: EntryIndex,
    session: i64,
    space: u32,
    tier: Option<String>,
    grant_rev: i64,
    end_rev: Option<i64>,
    end: HoldEnd,
}

/// A session in one revision space of one tier: `(lease id, tier, space)`.
type SessionKey = (i64, Option<String>, u32);

#[derive(Debug, Default)]
pub(crate) struct Releases {
    releases: Vec<Release>,
    holds: HashMap<(LockName, u64), Vec<Hold>>,
    /// `(session, tier, space)` -> the grant revisions of its holds.
    by_session: HashMap<SessionKey, Vec<(i64, EntryIndex)>>,
    /// Per tier, the highest revision space seen: every lower one was destroyed by a
    /// restore.
    last_space: HashMap<Option<String>, u32>,
}

impl Releases {
    pub(crate) fn released(
        &mut self,
        entry: EntryIndex,
        lock: &LockName,
        token: u64,
        unknown: bool,
    ) {
        self.releases.push(Release {
            entry,
            lock: lock.clone(),
            token,
            unknown,
        });
    }

    /// A space of `tier` seen in etcd's history (of an `etcd_hold` or a
    /// `restored_hold`, which is always of the home tier).
    pub(crate) fn space(&mut self, tier: Option<&str>, space: u32) {
        let last = self.last_space.entry(tier.map(str::to_owned)).or_default();
        *last = (*last).max(space);
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn etcd_hold(
        &mut self,
        entry: EntryIndex,
        lock: &LockName,
        token: u64,
        session: Option<i64>,
        (tier, space): (Option<&str>, u32),
        grant_rev: i64,
        end_rev: Option<i64>,
        end: HoldEnd,
    ) {
        self.space(tier, space);
        let Some(session) = session else { return };
        let tier = tier.map(str::to_owned);
        let hold = Hold {
            entry,
            session,
            space,
            tier: tier.clone(),
            grant_rev,
            end_rev,
            end,
        };
        self.holds
            .entry((lock.clone(), token))
            .or_default()
            .push(hold);
        self.by_session
            .entry((session, tier, space))
            .or_default()
            .push((grant_rev, entry));
    }

    pub(crate) fn finish(self, out: &mut Vec<Violation>) {
        for r in &self.releases {
            for h in self
                .holds
                .get(&(r.lock.clone(), r.token))
                .into_iter()
                .flatten()
            {
                let last = self.last_space.get(&h.tier).copied().unwrap_or(0);
                if h.end == HoldEnd::Open && h.space < last {
                    continue;
                }
                let lingered = matches!(h.end, HoldEnd::Expired | HoldEnd::Open);
                if r.unknown && !lingered {
                    continue;
                }
                let end = h.end_rev.unwrap_or(i64::MAX);
                let later = self
                    .by_session
                    .get(&(h.session, h.tier.clone(), h.space))
                    .into_iter()
                    .flatten()
                    .filter(|(rev, _)| *rev > h.grant_rev && *rev < end)
                    .min_by_key(|(rev, _)| *rev);
                if let Some(&(_, later)) = later {
                    out.push(Violation::ReleaseLeftHeld {
                        lock: r.lock.clone(),
                        release: r.entry,
                        hold: h.entry,
                        later,
                        unknown: r.unknown,
                    });
                }
            }
        }
    }
}
