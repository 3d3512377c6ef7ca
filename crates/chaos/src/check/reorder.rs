//! Puts a stream of entries back in `at_ns` order, within a window.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

use super::violation::EntryIndex;
use crate::history::Entry;

struct Held {
    index: EntryIndex,
    entry: Entry,
}

impl Held {
    fn key(&self) -> (u64, EntryIndex) {
        (self.entry.at_ns, self.index)
    }
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// Holds entries until every entry within `window` of the newest has been seen, then
/// hands them on oldest first. Memory: the entries of one window.
pub(crate) struct Reorder {
    window_ns: u64,
    newest: u64,
    held: BinaryHeap<Reverse<Held>>,
}

impl Reorder {
    pub(crate) fn new(window: Duration) -> Self {
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        Reorder {
            window_ns,
            newest: 0,
            held: BinaryHeap::new(),
        }
    }

    pub(crate) fn push(
        &mut self,
        index: EntryIndex,
        entry: Entry,
        mut emit: impl FnMut(EntryIndex, Entry),
    ) {
        self.newest = self.newest.max(entry.at_ns);
        self.held.push(Reverse(Held { index, entry }));
        let horizon = self.newest.saturating_sub(self.window_ns);
        while self
            .held
            .peek()
            .is_some_and(|Reverse(h)| h.entry.at_ns <= horizon)
        {
            let Reverse(h) = self.held.pop().expect("peeked");
            emit(h.index, h.entry);
        }
    }

    pub(crate) fn drain(&mut self, mut emit: impl FnMut(EntryIndex, Entry)) {
        while let Some(Reverse(h)) = self.held.pop() {
            emit(h.index, h.entry);
        }
    }
}
