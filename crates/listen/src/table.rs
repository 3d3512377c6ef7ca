//! The connections a listener holds, oldest first, and the cap on them.
//!
//! Rule: at the cap, a new connection replaces the oldest one with no request in flight
//! (see [`ConnLimits`](crate::ConnLimits)). A connection with a request in flight is
//! never closed to make room: its client is being served.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// One class of connections (the served ones, or the probe reserve) under one cap.
#[derive(Debug)]
pub(crate) struct Table {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// By id, so in accept order.
    open: BTreeMap<u64, Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    busy: Arc<AtomicUsize>,
    evict: Arc<Notify>,
}

/// A connection's place in a [`Table`]; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Slot {
    table: Arc<Table>,
    id: u64,
    entry: Entry,
}

impl Table {
    /// A table of at most `max` connections.
    pub(crate) fn new(max: usize) -> Arc<Table> {
        Arc::new(Table {
            max,
            inner: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the map consistent (each step is one
        // insert or remove), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many connections hold a place.
    pub(crate) fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// A place for a new connection: a free one, or the place of the oldest idle
    /// connection, which is told to close. `None` when every place has a request in
    /// flight (or the table holds none).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut inner = self.lock();
        if inner.open.len() >= self.max && !evict_oldest_idle(&mut inner) {
            return None;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let entry = Entry {
            busy: Arc::new(AtomicUsize::new(0)),
            evict: Arc::new(Notify::new()),
        };
        inner.open.insert(id, entry.clone());
        Some(Slot {
            table: Arc::clone(self),
            id,
            entry,
        })
    }

    /// Tells the oldest connection with no request in flight to close, and frees its
    /// place; false if there is none.
    pub(crate) fn evict_oldest_idle(&self) -> bool {
        evict_oldest_idle(&mut self.lock())
    }
}

fn evict_oldest_idle(inner: &mut Inner) -> bool {
    let idle = inner
        .open
        .iter()
        .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
        .map(|(id, _)| *id);
    match idle.and_then(|id| inner.open.remove(&id)) {
        Some(entry) => {
            // `notify_one` keeps the signal for a connection not yet waiting on it.
            entry.evict.notify_one();
            true
        }
        None => false,
    }
}

impl Slot {
    /// Completes once the table evicted this connection.
    pub(crate) async fn evicted(&self) {
        self.entry.evict.notified().await;
    }

    /// The counter of this connection's requests in flight.
    pub(crate) fn busy(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.entry.busy)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let table = Table::new(2);
        let a = table.admit().unwrap();
        let b = table.admit().unwrap();
        a.busy().fetch_add(1, Ordering::AcqRel);
        // `a` is busy: `b`, the oldest idle one, is evicted.
        let c = table.admit().expect("b makes room");
        assert_eq!(table.len(), 2);
        assert!(table.lock().open.contains_key(&a.id));
        assert!(!table.lock().open.contains_key(&b.id));
        // b learns it was evicted even though it was not waiting yet.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut evicted = std::pin::pin!(b.evicted());
        assert!(evicted.as_mut().poll(&mut cx).is_ready());
        // All busy: no room.
        c.busy().fetch_add(1, Ordering::AcqRel);
        assert!(table.admit().is_none());
        // A closed connection frees its place.
        drop(c);
        assert_eq!(table.len(), 1);
        assert!(table.admit().is_some());
    }

    #[test]
    fn an_empty_table_admits_nothing() {
        let table = Table::new(0);
        assert!(table.admit().is_none());
        assert!(!table.evict_oldest_idle());
    }

    use std::future::Future;
}
