//! A sequential model of the system that writes valid histories: an etcd revision counter
//! and epoch, locks with holders, and fenced resources with a mark and a commit counter.
//! Every history it writes is one a correct system could produce, so the checker must
//! pass it; tests then break it in one place.

#![allow(dead_code)] // Each test binary uses a part.

use std::collections::HashMap;

use palisade_chaos::history::{
    Entry, Event, FaultKind, ForceOutcome, HoldEnd, LockName, LossReason, Phase, Target,
    WriteOutcome,
};

/// The worker number of the nemesis and the runner.
pub(crate) const RUNNER: u32 = u32::MAX;

pub(crate) fn lock(key: &str) -> LockName {
    LockName {
        ns: "orders".into(),
        class: "jobs".into(),
        key: key.into(),
    }
}

pub(crate) fn token(epoch: u16, rev: i64) -> u64 {
    (u64::from(epoch) << 48) | rev as u64
}

/// A hold a worker was granted.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) lock: LockName,
    pub(crate) token: u64,
    pub(crate) worker: u32,
    record: usize,
}

/// A write invoked and not yet completed.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) op: u64,
    pub(crate) worker: u32,
    pub(crate) resource: String,
    pub(crate) target: Target,
    pub(crate) token: Option<u64>,
}

#[derive(Debug)]
struct HoldRecord {
    lock: LockName,
    worker: u32,
    epoch: u16,
    grant_rev: i64,
    end_rev: Option<i64>,
    exclusive: bool,
    end: HoldEnd,
    /// The revision space the record is of.
    space: u32,
    /// For a hold a restore brought back: the snapshot's revision.
    restored_rev: Option<i64>,
    /// `false` once a restore destroyed its space while it was open (it stays open there).
    live: bool,
    /// The record a restore made of this hold in the next space.
    moved_to: Option<usize>,
    /// The force release request that ended it.
    forced_by: Option<String>,
    /// The session etcd's history names (only for holds granted in a given session).
    session: Option<i64>,
}

#[derive(Debug, Default)]
struct Resource {
    mark: Option<u64>,
    seq: u64,
}

#[derive(Debug)]
pub(crate) struct Sim {
    pub(crate) entries: Vec<Entry>,
    at: u64,
    rev: i64,
    epoch: u16,
    next_op: u64,
    next_session: i64,
    holds: Vec<HoldRecord>,
    resources: HashMap<(Target, String), Resource>,
    unprotected: Vec<String>,
    /// The revision space: 0, then `n` after the `n`-th restore.
    space: u32,
    /// The first revision of the space, less one (the snapshot's revision after a restore).
    space_from: i64,
    /// Per destroyed space, the last revision the audit tailer had read.
    cuts: HashMap<u32, i64>,
}

impl Default for Sim {
    fn default() -> Self {
        Sim::new()
    }
}

impl Sim {
    /// Starts at epoch 1, revision 100, with the runner recording the epoch.
    pub(crate) fn new() -> Self {
        let mut sim = Sim {
            entries: Vec::new(),
            at: 0,
            rev: 100,
            epoch: 1,
            next_op: 1,
            next_session: 0x1000,
            holds: Vec::new(),
            resources: HashMap::new(),
            unprotected: Vec::new(),
            space: 0,
            space_from: 0,
            cuts: HashMap::new(),
        };
        sim.record(
            RUNNER,
            Event::EpochAdvanced {
                epoch: 1,
                tier: None,
            },
        );
        sim
    }

    /// Records an entry 10 ns after the previous one (room to insert entries between).
    pub(crate) fn record(&mut self, worker: u32, event: Event) -> usize {
        self.at += 10;
        self.entries.push(Entry {
            at_ns: self.at,
            worker,
            event,
        });
        self.entries.len() - 1
    }

    pub(crate) fn epoch(&self) -> u16 {
        self.epoch
    }

    pub(crate) fn rev(&self) -> i64 {
        self.rev
    }

    /// Sets etcd's revision before any hold was granted: the next write is `rev + 1`.
    pub(crate) fn set_rev(&mut self, rev: i64) {
        assert!(self.holds.is_empty(), "only before any hold");
        self.rev = rev;
    }

    /// A write to etcd that is no hold's grant or end (a waiter key put, say): one
    /// revision. Returns it.
    pub(crate) fn other_write(&mut self) -> i64 {
        self.rev += 1;
        self.rev
    }

    fn open_holders<'a>(&'a self, lock: &'a LockName) -> impl Iterator<Item = &'a HoldRecord> + 'a {
        self.holds
            .iter()
            .filter(move |h| h.lock == *lock && h.end == HoldEnd::Open && h.live)
    }

    /// Whether `lock` can be granted in this mode now.
    pub(crate) fn can_grant(&self, lock: &LockName, exclusive: bool) -> bool {
        let mut open = self.open_holders(lock).peekable();
        if exclusive {
            open.peek().is_none()
        } else {
            self.open_holders(lock).all(|h| !h.exclusive)
        }
    }

    /// Acquire and grant at once (the lock must be free for this mode).
    pub(crate) fn acquire(&mut self, worker: u32, lock: &LockName, exclusive: bool) -> Hold {
        assert!(
            self.can_grant(lock, exclusive),
            "the model grants only free locks"
        );
        self.record(worker, Event::AcquireInvoked { lock: lock.clone() });
        self.rev += 1;
        let token = token(self.epoch, self.rev);
        self.next_session += 1;
        let session = self.next_session;
        self.record(
            worker,
            Event::Granted {
                lock: lock.clone(),
                token,
                session,
                grant_rev: self.rev,
                tier: None,
            },
        );
        self.holds.push(HoldRecord {
            lock: lock.clone(),
            worker,
            epoch: self.epoch,
            grant_rev: self.rev,
            end_rev: None,
            exclusive,
            end: HoldEnd::Open,
            space: self.space,
            restored_rev: None,
            live: true,
            moved_to: None,
            forced_by: None,
            session: None,
        });
        Hold {
            lock: lock.clone(),
            token,
            worker,
            record: self.holds.len() - 1,
        }
    }

    /// [`Sim::acquire`] in the session `session`, which etcd's history names.
    pub(crate) fn acquire_in(
        &mut self,
        worker: u32,
        lock: &LockName,
        exclusive: bool,
        session: i64,
    ) -> Hold {
        let hold = self.acquire(worker, lock, exclusive);
        let Event::Granted { session: s, .. } = &mut self.entries.last_mut().unwrap().event else {
            unreachable!("acquire records the grant last")
        };
        *s = session;
        self.holds[hold.record].session = Some(session);
        hold
    }

    /// [`Sim::acquire_in`] for an acquire whose `acquire_invoked` was recorded earlier
    /// (one of two racing on a session): grants without recording another.
    pub(crate) fn grant_in(
        &mut self,
        worker: u32,
        lock: &LockName,
        exclusive: bool,
        session: i64,
    ) -> Hold {
        let hold = self.acquire_in(worker, lock, exclusive, session);
        let invoked = self.entries.len() - 2;
        assert!(matches!(
            self.entries[invoked].event,
            Event::AcquireInvoked { .. }
        ));
        self.entries.remove(invoked);
        hold
    }

    /// Ends `hold` in etcd without telling its worker.
    pub(crate) fn end_quietly(&mut self, hold: &Hold, end: HoldEnd) {
        self.end(hold, end);
    }

    pub(crate) fn fail_acquire(&mut self, worker: u32, lock: &LockName) {
        self.record(worker, Event::AcquireInvoked { lock: lock.clone() });
        self.record(
            worker,
            Event::AcquireFailed {
                lock: lock.clone(),
                error: "deadline passed".into(),
            },
        );
    }

    /// The record of `hold` in the current space (following restores).
    fn current(&self, hold: &Hold) -> usize {
        let mut at = hold.record;
        while let Some(next) = self.holds[at].moved_to {
            at = next;
        }
        at
    }

    /// Whether `hold` is held now: open, and in the current space.
    pub(crate) fn is_held(&self, hold: &Hold) -> bool {
        let record = &self.holds[self.current(hold)];
        record.live && record.end == HoldEnd::Open
    }

    fn end(&mut self, hold: &Hold, end: HoldEnd) {
        let at = self.current(hold);
        let record = &mut self.holds[at];
        assert!(record.live, "only a hold of the current space ends");
        assert_eq!(record.end, HoldEnd::Open, "a hold ends once");
        self.rev += 1;
        record.end = end;
        record.end_rev = Some(self.rev);
    }

    pub(crate) fn release(&mut self, hold: &Hold) {
        self.end(hold, HoldEnd::Released);
        let release_rev = Some(self.rev);
        self.record(
            hold.worker,
            Event::Released {
                lock: hold.lock.clone(),
                token: hold.token,
                release_rev,
            },
        );
    }

    /// The worker's release gets no definite answer in time; the client's background
    /// retry then lands.
    pub(crate) fn release_unknown(&mut self, hold: &Hold) {
        self.record(
            hold.worker,
            Event::ReleaseUnknown {
                lock: hold.lock.clone(),
                token: hold.token,
            },
        );
        self.end(hold, HoldEnd::Released);
    }

    /// An admin requests a force release of `hold`, another approves it, and the
    /// holder's client is told. Returns the request's id.
    pub(crate) fn force(&mut self, hold: &Hold) -> String {
        let request_id = self.force_untold(hold);
        let reason = LossReason::Forced {
            request_id: Some(request_id.clone()),
        };
        self.tell_lost(hold, reason);
        request_id
    }

    /// [`Sim::force`] without telling the holder (tell it with [`Sim::tell_lost`]).
    pub(crate) fn force_untold(&mut self, hold: &Hold) -> String {
        let request_id = format!("force-{}", self.entries.len());
        let grant_rev = self.holds[self.current(hold)].grant_rev;
        self.record(
            RUNNER,
            Event::ForceRequested {
                lock: hold.lock.clone(),
                request_id: request_id.clone(),
                targets: vec![grant_rev],
            },
        );
        self.end(hold, HoldEnd::Forced);
        let at = self.current(hold);
        self.holds[at].forced_by = Some(request_id.clone());
        self.record(
            RUNNER,
            Event::ForceApproved {
                lock: hold.lock.clone(),
                request_id: request_id.clone(),
                outcome: ForceOutcome::Released {
                    grant_revs: vec![grant_rev],
                },
            },
        );
        request_id
    }

    /// The holder of `hold` is told its loss.
    pub(crate) fn tell_lost(&mut self, hold: &Hold, reason: LossReason) -> usize {
        self.record(
            hold.worker,
            Event::Lost {
                lock: hold.lock.clone(),
                token: hold.token,
                reason: Some(reason),
            },
        )
    }

    /// Moves the clock `ns` on (records stay 10 ns apart after it).
    pub(crate) fn advance(&mut self, ns: u64) {
        self.at += ns;
    }

    /// The time of the last record, ns.
    pub(crate) fn now(&self) -> u64 {
        self.at
    }

    pub(crate) fn fault(&mut self, kind: FaultKind, phase: Phase) {
        self.record(
            RUNNER,
            Event::Fault {
                kind,
                phase,
                detail: "model".into(),
                paused_worker: None,
            },
        );
    }

    /// Restores etcd to a snapshot `back` revisions ago (not before the space began) and
    /// advances the epoch. The holds whose keys were in the snapshot come back: granted
    /// at or before it and not ended by then. Each is held again in the new space, by the
    /// same worker with the same token, until it ends there; the handles of these
    /// restored holds are returned. Holds open when the space is destroyed stay open in
    /// it (as etcd's history of a destroyed space lists them). The audit tailer had read
    /// the space up to `unaudited` revisions before its end: the events of those last
    /// revisions have no audit row, and an `audit_cut` says so.
    pub(crate) fn restore_and_advance(&mut self, back: i64, unaudited: i64) -> Vec<Hold> {
        self.fault(FaultKind::RestoreEtcdAndAdvanceEpoch, Phase::Start);
        let through = self.rev - unaudited;
        self.cuts.insert(self.space, through);
        self.record(
            RUNNER,
            Event::AuditCut {
                space: self.space,
                through,
            },
        );
        let snapshot = (self.rev - back).max(self.space_from);
        let (space, next) = (self.space, self.space + 1);
        let mut restored = Vec::new();
        for at in 0..self.holds.len() {
            let h = &self.holds[at];
            if h.space != space || !h.live {
                continue;
            }
            let in_snapshot = (h.restored_rev.is_some() || h.grant_rev <= snapshot)
                && h.end_rev.is_none_or(|e| e > snapshot);
            if in_snapshot {
                let record = HoldRecord {
                    lock: h.lock.clone(),
                    worker: h.worker,
                    epoch: h.epoch,
                    grant_rev: h.grant_rev,
                    end_rev: None,
                    exclusive: h.exclusive,
                    end: HoldEnd::Open,
                    space: next,
                    restored_rev: Some(snapshot),
                    live: true,
                    moved_to: None,
                    forced_by: None,
                    session: None,
                };
                let token = token(record.epoch, record.grant_rev);
                restored.push(Hold {
                    lock: record.lock.clone(),
                    token,
                    worker: record.worker,
                    record: self.holds.len(),
                });
                self.holds[at].moved_to = Some(self.holds.len());
                self.holds.push(record);
            }
            self.holds[at].live = false;
        }
        self.rev = snapshot;
        self.space = next;
        self.space_from = snapshot;
        self.epoch += 1;
        self.record(
            RUNNER,
            Event::EpochAdvanced {
                epoch: self.epoch,
                tier: None,
            },
        );
        self.fault(FaultKind::RestoreEtcdAndAdvanceEpoch, Phase::End);
        restored
    }

    pub(crate) fn begin_write(
        &mut self,
        worker: u32,
        resource: &str,
        target: Target,
        token: Option<u64>,
    ) -> Pending {
        let op = self.next_op;
        self.next_op += 1;
        self.record(
            worker,
            Event::WriteInvoked {
                resource: resource.into(),
                target,
                token,
                op,
            },
        );
        Pending {
            op,
            worker,
            resource: resource.into(),
            target,
            token,
        }
    }

    /// What the resource does with the write now: refuse it, or commit it.
    fn apply(&mut self, w: &Pending) -> WriteOutcome {
        let advisory = w.resource.starts_with("/legacy/");
        let state = self
            .resources
            .entry((w.target, w.resource.clone()))
            .or_default();
        match w.token {
            None if advisory => {
                state.seq += 1;
                self.unprotected.push(w.resource.clone());
                WriteOutcome::Committed { seq: state.seq }
            }
            None => WriteOutcome::Rejected { highest: None },
            Some(t) if state.mark.is_some_and(|m| t < m) => WriteOutcome::Rejected {
                highest: state.mark,
            },
            Some(t) => {
                state.mark = Some(t);
                state.seq += 1;
                WriteOutcome::Committed { seq: state.seq }
            }
        }
    }

    /// The write reaches the resource now and its writer learns the outcome.
    pub(crate) fn finish_write(&mut self, w: &Pending) -> WriteOutcome {
        let outcome = self.apply(w);
        self.complete(w, outcome.clone());
        outcome
    }

    /// The writer gives up; the write reached the resource (`applied`) or not.
    pub(crate) fn finish_indeterminate(&mut self, w: &Pending, applied: bool) {
        if applied {
            self.apply(w);
        }
        self.complete(
            w,
            WriteOutcome::Indeterminate {
                reason: "timed out".into(),
            },
        );
    }

    fn complete(&mut self, w: &Pending, outcome: WriteOutcome) -> usize {
        let event = Event::WriteCompleted {
            resource: w.resource.clone(),
            target: w.target,
            token: w.token,
            op: w.op,
            outcome,
        };
        self.record(w.worker, event)
    }

    pub(crate) fn write(
        &mut self,
        worker: u32,
        resource: &str,
        target: Target,
        token: Option<u64>,
    ) -> WriteOutcome {
        let w = self.begin_write(worker, resource, target, token);
        self.finish_write(&w)
    }

    /// Appends what is read after the run: etcd's holds, then the audit trail.
    pub(crate) fn finish(mut self) -> Vec<Entry> {
        let holds = std::mem::take(&mut self.holds);
        for h in &holds {
            let event = match h.restored_rev {
                None => Event::EtcdHold {
                    lock: h.lock.clone(),
                    epoch: h.epoch,
                    grant_rev: h.grant_rev,
                    end_rev: h.end_rev,
                    exclusive: h.exclusive,
                    end: h.end,
                    space: h.space,
                    session: h.session,
                    tier: None,
                },
                Some(restored_rev) => Event::RestoredHold {
                    lock: h.lock.clone(),
                    epoch: h.epoch,
                    grant_rev: h.grant_rev,
                    restored_rev,
                    space: h.space,
                    end_rev: h.end_rev,
                    exclusive: h.exclusive,
                    end: h.end,
                },
            };
            self.record(RUNNER, event);
            if let (Some(request_id), Some(end_rev)) = (&h.forced_by, h.end_rev) {
                let event = Event::EtcdForced {
                    lock: h.lock.clone(),
                    epoch: h.epoch,
                    grant_rev: h.grant_rev,
                    end_rev,
                    space: h.space,
                    request_id: request_id.clone(),
                };
                self.record(RUNNER, event);
            }
        }
        // The audit trail records each hold from the space that granted it; its rows
        // about restored history are left out by the harness.
        for h in holds.iter().filter(|h| h.restored_rev.is_none()) {
            let cut = self.cuts.get(&h.space).copied().unwrap_or(i64::MAX);
            let token = Some(token(h.epoch, h.grant_rev));
            let row = |kind: &str, revision| Event::AuditRow {
                kind: kind.into(),
                lock: Some(h.lock.clone()),
                resource: None,
                token,
                revision,
            };
            if h.grant_rev <= cut {
                self.record(RUNNER, row("grant", Some(h.grant_rev)));
            }
            let end = match h.end {
                HoldEnd::Released => "release",
                HoldEnd::Expired => "expire",
                HoldEnd::Forced => "force",
                HoldEnd::Open => continue,
            };
            if h.end_rev.is_some_and(|e| e <= cut) {
                self.record(RUNNER, row(end, h.end_rev));
            }
            // The approving replica's record, written whether or not the tailer read
            // the force.
            if h.end == HoldEnd::Forced {
                self.record(RUNNER, row("force_release", h.end_rev));
            }
        }
        for resource in std::mem::take(&mut self.unprotected) {
            let row = Event::AuditRow {
                kind: "unprotected_write".into(),
                lock: None,
                resource: Some(resource),
                token: None,
                revision: None,
            };
            self.record(RUNNER, row);
        }
        self.entries
    }
}

/// A small deterministic generator (splitmix64).
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A random valid history of about `steps` operations by `workers` workers over `locks`
/// locks: grants, expiries that let stale holders write on, releases, concurrent and
/// indeterminate writes, unprotected writes, faults and epoch advances.
pub(crate) fn random_history(seed: u64, workers: u32, locks: usize, steps: usize) -> Vec<Entry> {
    let mut rng = Rng(seed);
    let mut sim = Sim::new();
    let names: Vec<LockName> = (0..locks).map(|i| lock(&format!("k{i}"))).collect();
    // Per worker: the holds it was granted (current or not).
    let mut held: Vec<Vec<Hold>> = vec![Vec::new(); workers as usize];
    let mut open: Vec<Hold> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut told: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for _ in 0..steps {
        let worker = rng.below(workers as usize) as u32;
        match rng.below(100) {
            0..=14 => {
                let i = rng.below(locks);
                let exclusive = i != 0; // lock k0 is shared
                if sim.can_grant(&names[i], exclusive) {
                    let hold = sim.acquire(worker, &names[i], exclusive);
                    held[worker as usize].push(hold.clone());
                    open.push(hold);
                } else if rng.chance(30) {
                    sim.fail_acquire(worker, &names[i]);
                }
            }
            15..=21 if !open.is_empty() => {
                let hold = open.swap_remove(rng.below(open.len()));
                assert!(sim.is_held(&hold));
                match rng.below(10) {
                    0..=4 => sim.release(&hold),
                    5 => sim.release_unknown(&hold),
                    6..=8 => {
                        // Paused past its TTL: the worker writes on before it is told
                        // (and in this model it never is).
                        sim.fault(FaultKind::PauseWorker, Phase::Start);
                        sim.end_quietly(&hold, HoldEnd::Expired);
                        sim.fault(FaultKind::PauseWorker, Phase::End);
                    }
                    _ => {
                        sim.force(&hold);
                        told.insert(hold.token);
                    }
                }
            }
            22..=61 if !held[worker as usize].is_empty() => {
                // A write with this worker's latest token, or an older one (a stale writer).
                let mine = &held[worker as usize];
                let hold = if rng.chance(80) {
                    mine[mine.len() - 1].clone()
                } else {
                    mine[rng.below(mine.len())].clone()
                };
                // A worker told its hold is lost writes no more with it.
                if told.contains(&hold.token) {
                    continue;
                }
                let index = hold.lock.key[1..].parse::<usize>().unwrap();
                let (resource, target) = if rng.chance(50) {
                    (format!("row-{index}"), Target::Postgres)
                } else {
                    (format!("/r/{index}"), Target::Http)
                };
                pending.push(sim.begin_write(worker, &resource, target, Some(hold.token)));
            }
            62..=64 => {
                let resource = format!("/legacy/{}", rng.below(3));
                pending.push(sim.begin_write(worker, &resource, Target::Http, None));
            }
            65..=94 if !pending.is_empty() => {
                let w = pending.swap_remove(rng.below(pending.len()));
                if rng.chance(5) {
                    let applied = rng.chance(50);
                    sim.finish_indeterminate(&w, applied);
                } else {
                    sim.finish_write(&w);
                }
            }
            95 => {
                let kind = [
                    FaultKind::KillEtcdLeader,
                    FaultKind::PauseEtcdMember,
                    FaultKind::RestartPostgres,
                ][rng.below(3)];
                sim.fault(kind, Phase::Start);
                sim.fault(kind, Phase::End);
            }
            96 if rng.chance(20) => {
                for w in std::mem::take(&mut pending) {
                    sim.finish_write(&w);
                }
                // Some holds are released first; the others stay open across the restore,
                // and those in the snapshot come back.
                for hold in std::mem::take(&mut open) {
                    if rng.chance(50) {
                        sim.release(&hold);
                    }
                }
                let back = rng.below(15) as i64;
                let unaudited = rng.below(3) as i64;
                open = sim.restore_and_advance(back, unaudited);
            }
            _ => {}
        }
    }
    for w in std::mem::take(&mut pending) {
        sim.finish_write(&w);
    }
    sim.finish()
}
