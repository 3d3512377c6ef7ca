//! Checks (a) and (b) on writes, per resource, and the write entries' own consistency.
//!
//! Memory per resource is its high-water evidence, the writes in flight, and a window of
//! committed writes that a later commit could still precede: a commit recorded later can
//! only take a sequence number above the smallest of (the largest sequence number completed
//! before each write in flight was invoked) and (the largest completed before now). Writes
//! at or below that floor are folded into one summary, so the window holds about as many
//! writes as run concurrently, not as many as the run made.

use std::collections::{BTreeMap, HashMap};

use super::floor::Floor;
use super::report::Counts;
use super::violation::{EntryIndex, Mark, ResourceId, Violation, WriteRef};
use crate::history::{Target, WriteOutcome};

/// Fold the window once it holds more than this many writes.
const FOLD_AT: usize = 32;

/// A write invoked and not yet completed.
#[derive(Debug)]
struct InFlight {
    invoked: EntryIndex,
    target: Target,
    resource: String,
    token: Option<u64>,
    /// The committed write with the largest seq completed before this one was invoked.
    completed_before: Option<WriteRef>,
    /// The resource's mark known before this write was invoked.
    mark: Option<Mark>,
}

/// The writes of one resource that are folded out of the window.
#[derive(Debug)]
struct Folded {
    /// The largest folded seq.
    max_seq: u64,
    /// The folded write with the largest token.
    max_token: Option<WriteRef>,
}

#[derive(Debug)]
struct Resource {
    /// The highest mark known, by completion time: committed tokens and reported marks.
    mark: Floor<Mark>,
    /// The committed write with the largest seq, by completion time.
    completed: Floor<WriteRef>,
    /// Committed writes by seq, above `folded.max_seq`.
    window: BTreeMap<u64, WriteRef>,
    folded: Option<Folded>,
    /// Ops in flight and the seq completed before each was invoked (0: none).
    in_flight: HashMap<u64, u64>,
}

impl Resource {
    fn new() -> Self {
        Resource {
            mark: Floor::new(),
            completed: Floor::new(),
            window: BTreeMap::new(),
            folded: None,
            in_flight: HashMap::new(),
        }
    }
}

/// One completion, as the checker reads it.
pub(crate) struct Completion<'a> {
    pub(crate) index: EntryIndex,
    pub(crate) at_ns: u64,
    pub(crate) worker: u32,
    pub(crate) resource: &'a str,
    pub(crate) target: Target,
    pub(crate) token: Option<u64>,
    pub(crate) op: u64,
    pub(crate) outcome: &'a WriteOutcome,
}

/// The state of every resource and every write in flight.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    /// Per target, per resource name (two maps, so lookups need no allocation).
    postgres: HashMap<String, Resource>,
    http: HashMap<String, Resource>,
    in_flight: HashMap<u64, InFlight>,
    /// The first invocation that carried each token, checked against grants at the end.
    tokens: HashMap<u64, EntryIndex>,
}

impl Writes {
    fn resource(&mut self, target: Target, name: &str) -> &mut Resource {
        let map = match target {
            Target::Postgres => &mut self.postgres,
            Target::Http => &mut self.http,
        };
        if !map.contains_key(name) {
            map.insert(name.to_owned(), Resource::new());
        }
        map.get_mut(name).expect("inserted above")
    }

    /// A `write_invoked` entry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn invoke(
        &mut self,
        index: EntryIndex,
        at_ns: u64,
        resource: &str,
        target: Target,
        token: Option<u64>,
        op: u64,
        out: &mut Vec<Violation>,
    ) {
        let state = self.resource(target, resource);
        let completed_before = state.completed.before(at_ns).map(|(_, w)| w.clone());
        let mark = state.mark.before(at_ns).map(|(_, m)| m.clone());
        state.in_flight.insert(
            op,
            completed_before.as_ref().and_then(|w| w.seq).unwrap_or(0),
        );
        if let Some(t) = token {
            self.tokens.entry(t).or_insert(index);
        }
        let flight = InFlight {
            invoked: index,
            target,
            resource: resource.to_owned(),
            token,
            completed_before,
            mark,
        };
        if let Some(first) = self.in_flight.insert(op, flight) {
            out.push(Violation::OpReused {
                first: first.invoked,
                second: index,
                op,
            });
            if first.resource != resource || first.target != target {
                self.resource(first.target, &first.resource)
                    .in_flight
                    .remove(&op);
            }
        }
    }

    /// A `write_completed` entry.
    pub(crate) fn complete(
        &mut self,
        c: Completion<'_>,
        counts: &mut Counts,
        out: &mut Vec<Violation>,
    ) {
        let flight = self.in_flight.remove(&c.op);
        match &flight {
            None => out.push(Violation::CompletionWithoutInvocation {
                entry: c.index,
                op: c.op,
            }),
            Some(f) => {
                if f.resource != c.resource || f.target != c.target || f.token != c.token {
                    out.push(Violation::CompletionDiffers {
                        invoked: f.invoked,
                        completed: c.index,
                        op: c.op,
                    });
                    self.resource(f.target, &f.resource).in_flight.remove(&c.op);
                }
            }
        }
        let id = || ResourceId {
            target: c.target,
            resource: c.resource.to_owned(),
        };
        let state = self.resource(c.target, c.resource);
        state.in_flight.remove(&c.op);
        let mut write = WriteRef {
            entry: c.index,
            op: c.op,
            worker: c.worker,
            token: c.token,
            seq: None,
        };
        match c.outcome {
            WriteOutcome::Committed { seq } => {
                counts.writes_committed += 1;
                if c.token.is_none() {
                    counts.unprotected_writes += 1;
                }
                write.seq = Some(*seq);
                if let Some(f) = &flight {
                    check_admission(f, &write, id, out);
                }
                let admitted = flight.as_ref().is_none_or(|f| {
                    f.completed_before
                        .as_ref()
                        .and_then(|w| w.seq)
                        .is_none_or(|before| *seq > before)
                });
                if admitted {
                    place(state, &write, id, out);
                }
                state.completed.record(c.at_ns, *seq, write.clone());
                if let Some(t) = c.token {
                    state.mark.record(c.at_ns, t, Mark::Committed(write));
                }
            }
            WriteOutcome::Rejected { highest } => {
                counts.writes_rejected += 1;
                if c.token.is_some() {
                    counts.stale_writes_rejected += 1;
                }
                if let Some(h) = *highest {
                    if c.token.is_some_and(|t| t >= h) {
                        out.push(Violation::UnjustifiedRejection {
                            resource: id(),
                            write: write.clone(),
                            highest: h,
                        });
                    }
                    state
                        .mark
                        .record(c.at_ns, h, Mark::Reported { write, highest: h });
                }
            }
            WriteOutcome::Indeterminate { .. } => counts.writes_indeterminate += 1,
        }
        fold(state, c.at_ns);
    }

    /// Tokens carried by writes, with the first invocation that carried each.
    pub(crate) fn tokens(&self) -> impl Iterator<Item = (u64, EntryIndex)> + '_ {
        self.tokens.iter().map(|(t, i)| (*t, *i))
    }

    /// Committed writes kept in windows, over all resources (for the memory bound's test).
    #[cfg(test)]
    pub(crate) fn retained(&self) -> usize {
        self.postgres
            .values()
            .chain(self.http.values())
            .map(|r| r.window.len())
            .sum()
    }
}

/// Checks (b) and the real-time half of (a) for a committed write.
fn check_admission(
    flight: &InFlight,
    write: &WriteRef,
    id: impl Fn() -> ResourceId,
    out: &mut Vec<Violation>,
) {
    if let (Some(t), Some(mark)) = (write.token, &flight.mark) {
        if t < mark.token() {
            out.push(Violation::StaleWriteAdmitted {
                resource: id(),
                write: write.clone(),
                invoked: flight.invoked,
                mark: mark.clone(),
            });
        }
    }
    if let (Some(seq), Some(before)) = (write.seq, &flight.completed_before) {
        if before.seq.is_some_and(|b| seq <= b) {
            out.push(Violation::CommitBeforeInvocation {
                resource: id(),
                write: write.clone(),
                invoked: flight.invoked,
                completed_before: before.clone(),
            });
        }
    }
}

/// Check (a): puts a committed write in its resource's commit order and compares its token
/// with every write before and after it there.
fn place(
    state: &mut Resource,
    write: &WriteRef,
    id: impl Fn() -> ResourceId,
    out: &mut Vec<Violation>,
) {
    let seq = write.seq.expect("committed writes have a seq");
    if let Some(folded) = &state.folded {
        if seq <= folded.max_seq {
            // Below the floor: only a write the real-time check already reported, or one
            // without an invocation, lands here; its place among folded writes is unknown.
            return;
        }
    }
    if let Some(first) = state.window.get(&seq) {
        out.push(Violation::SeqReused {
            resource: id(),
            first: first.clone(),
            second: write.clone(),
        });
        return;
    }
    if let Some(t) = write.token {
        let folded = state.folded.as_ref().and_then(|f| f.max_token.as_ref());
        let before = state
            .window
            .range(..seq)
            .map(|(_, w)| w)
            .chain(folded)
            .filter(|w| w.token.is_some());
        if let Some(earlier) = before.max_by_key(|w| w.token) {
            if earlier.token > Some(t) {
                out.push(Violation::CommitOrder {
                    resource: id(),
                    earlier: earlier.clone(),
                    later: write.clone(),
                });
            }
        }
        let after = state
            .window
            .range(seq + 1..)
            .map(|(_, w)| w)
            .filter(|w| w.token.is_some());
        if let Some(later) = after.min_by_key(|w| w.token) {
            if later.token < Some(t) {
                out.push(Violation::CommitOrder {
                    resource: id(),
                    earlier: write.clone(),
                    later: later.clone(),
                });
            }
        }
    }
    state.window.insert(seq, write.clone());
}

/// Folds the writes that no later commit can precede out of the window.
fn fold(state: &mut Resource, now_ns: u64) {
    if state.window.len() <= FOLD_AT {
        return;
    }
    let done = state
        .completed
        .before(now_ns)
        .and_then(|(_, w)| w.seq)
        .unwrap_or(0);
    let floor = state
        .in_flight
        .values()
        .copied()
        .min()
        .map_or(done, |f| f.min(done));
    let keep = state.window.split_off(&(floor + 1));
    let gone = std::mem::replace(&mut state.window, keep);
    if let Some((&max_seq, _)) = gone.last_key_value() {
        let folded = state.folded.get_or_insert(Folded {
            max_seq,
            max_token: None,
        });
        folded.max_seq = max_seq;
        for w in gone.into_values() {
            if w.token.is_some() && folded.max_token.as_ref().is_none_or(|m| w.token > m.token) {
                folded.max_token = Some(w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_stays_small_over_a_long_run_of_writes() {
        let mut writes = Writes::default();
        let mut counts = Counts::default();
        let mut out = Vec::new();
        let outcome = |seq| WriteOutcome::Committed { seq };
        let mut seq = 0;
        let mut at = 0;
        // 4 workers, each with one write in flight at a time, interleaved.
        for round in 0..25_000u64 {
            for worker in 0..4u64 {
                at += 1;
                writes.invoke(
                    EntryIndex(0),
                    at,
                    "row",
                    Target::Postgres,
                    Some(round + 1),
                    round * 4 + worker,
                    &mut out,
                );
            }
            for worker in 0..4u64 {
                at += 1;
                seq += 1;
                let o = outcome(seq);
                let c = Completion {
                    index: EntryIndex(0),
                    at_ns: at,
                    worker: worker as u32,
                    resource: "row",
                    target: Target::Postgres,
                    token: Some(round + 1),
                    op: round * 4 + worker,
                    outcome: &o,
                };
                writes.complete(c, &mut counts, &mut out);
            }
        }
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(counts.writes_committed, 100_000);
        assert!(
            writes.retained() <= FOLD_AT + 4,
            "window kept {} writes",
            writes.retained()
        );
    }
}
