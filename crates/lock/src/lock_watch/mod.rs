//! One etcd watch per lock per locker, shared by every waiter of the locker on that lock.
//!
//! A waiter waits for a few keys of its lock: its predecessor's waiter and hold keys, and
//! its own hold key (a hand-over). The first waiter of the locker on a lock creates one
//! watch on the lock's waiter and hold keys (`[h/, q/]`, the range of
//! [`palisade_api::keys::LockKeys::wait_range`]), on one of the shared streams of
//! [`crate::watches`]; every later waiter of the locker on that lock joins it, with no
//! round trip to etcd, and the watch is cancelled when the last of them leaves. Watches
//! are created rarely because etcd 3.4 copies its write buffer for every watch it
//! creates (BENCHMARKS.md, section 4).
//!
//! **Joining late, missing nothing.** A waiter decides on a view of the lock read at some
//! revision `V`, and needs every write to its keys after `V`. A shared watch that has run
//! for a while may already have passed such writes along before the waiter joined, so
//! the watch keeps its latest messages ([`RECENT`] of them) and gives a joining waiter
//! those about its keys above `V`. What a [`LockSubscription`] promises is stated by
//! [`LockSubscription::covered_from`]: every write to its keys at a revision above it is
//! passed on, from the kept messages or as it comes. A waiter whose view is at or above
//! that revision decides on the view; one whose view is older (a watch created after the
//! view, or kept messages trimmed past it) reads its keys first (see `wait_released` in
//! `acquire/wait.rs`).
//!
//! A locker with waiters on a lock so receives every write to the lock's hold and waiter
//! keys, and wakes only the waiters whose keys a write touches. This assumes lockers are
//! few (a process, a replica of the lock service): etcd sends each write to one watcher
//! per locker with waiters on the lock.
//!
//! **A silent watch.** A waiter whose lock's watch has passed nothing on (to any waiter)
//! for [`QUIET_TIMEOUTS`] request timeouts reads its keys; if they changed, the watch
//! missed a write (its member stopped passing them on while its connection stayed up)
//! and the waiter ends it for all ([`LockSubscription::distrust`]), so the next waiter
//! creates it anew.
//!
//! etcd sends a watch's events in revision order, and the events of one revision in one
//! message (etcd 3.4 fragments a message only when asked to, which this watch does not),
//! so a message is kept and trimmed whole. When the watch's stream fails or etcd cancels
//! the watch (compaction, a member that went away), every subscription on it ends (its
//! [`LockSubscription::next`] returns `None`) and the next waiter creates a new watch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use etcd_client::{ResponseHeader, WatchOptions, WatchResponse};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::watches::{Subscription, Watches};
use palisade_api::keys::LockKeys;

/// How many of its latest messages (those with events) a lock's watch keeps for waiters
/// that join it. A waiter joins right after the read it decides on (one round trip, or
/// the time another waiter takes to create the watch), so a few dozen cover even a lock
/// cycling a thousand times a second; one whose view is older than what is kept reads
/// its keys once instead.
pub(crate) const RECENT: usize = 128;

/// How long, in request timeouts, a lock's watch may pass nothing on before a waiter on
/// it reads its keys anyway: a watch whose member stopped passing writes on (while its
/// connection stays up) would otherwise keep every waiter of the locker on the lock
/// waiting until its deadline. A read that finds a write the watch never passed on ends
/// the watch ([`LockSubscription::distrust`]).
pub(crate) const QUIET_TIMEOUTS: u32 = 10;

/// Every lock of the locker that has a watch, or is having one created, by the lock's
/// base path. A slot's async lock makes one waiter create the watch while the others
/// of the lock wait for it (after a failed stream, a whole queue re-subscribes at once).
type Registry = Mutex<HashMap<String, Arc<Slot>>>;
type Slot = tokio::sync::Mutex<Weak<Shared>>;

/// The locker's shared lock watches.
#[derive(Default)]
pub(crate) struct LockWatches {
    registry: Arc<Registry>,
}

/// One lock's watch, alive while a subscription holds it.
struct Shared {
    base: String,
    state: Arc<Mutex<State>>,
    /// etcd's confirmation of the watch.
    created: ResponseHeader,
    registry: Weak<Registry>,
    /// Reads the watch and passes its messages on; aborting it drops the watch's
    /// [`Subscription`], which cancels the watch in etcd.
    task: JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(registry) = self.registry.upgrade() {
            forget_if_unused(&registry, &self.base);
        }
    }
}

struct State {
    /// False once the watch's stream failed or the watch was cancelled.
    open: bool,
    /// Every message with an event above this revision is in `recent` or still to come.
    covered: i64,
    /// When the watch last passed a message on (or was created).
    last_message: Instant,
    /// The latest messages with events, oldest first, each with its highest revision.
    recent: VecDeque<(i64, WatchResponse)>,
    subscribers: HashMap<u64, Subscriber>,
    /// The subscribers of each wanted key (a message is routed by its events' keys, not
    /// matched against every subscriber: a lock with 64 waiters has 64 subscribers).
    by_key: HashMap<Vec<u8>, Vec<u64>>,
    next_id: u64,
}

struct Subscriber {
    keys: Vec<Vec<u8>>,
    tx: mpsc::UnboundedSender<WatchResponse>,
}

impl State {
    /// The subscribers that want `msg` (an event on one of their keys), each once.
    fn wanting(&self, msg: &WatchResponse) -> Vec<u64> {
        let mut ids: Vec<u64> = msg
            .events()
            .iter()
            .filter_map(|e| self.by_key.get(e.kv()?.key()))
            .flatten()
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn remove(&mut self, id: u64) {
        let Some(sub) = self.subscribers.remove(&id) else {
            return;
        };
        for key in sub.keys {
            if let Some(ids) = self.by_key.get_mut(&key) {
                ids.retain(|&i| i != id);
                if ids.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// Ends every subscription (dropping the senders ends their receivers).
    fn end(&mut self) {
        self.open = false;
        self.subscribers.clear();
        self.by_key.clear();
        self.recent.clear();
    }
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update under these locks leaves the state consistent (inserts, removes and a
    // flag), so a poisoned lock is used as is.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A waiter's place on its lock's watch. Dropping it leaves; the last to leave cancels
/// the watch.
pub(crate) struct LockSubscription {
    shared: Arc<Shared>,
    id: u64,
    covered_from: i64,
    rx: mpsc::UnboundedReceiver<WatchResponse>,
}

impl Drop for LockSubscription {
    fn drop(&mut self) {
        guard(&self.shared.state).remove(self.id);
    }
}

impl LockSubscription {
    /// Every write to this subscription's keys at a revision above this one is passed
    /// on by [`LockSubscription::next`], once (and some at or below it too: a waiter
    /// skips what it has already accounted for).
    pub(crate) fn covered_from(&self) -> i64 {
        self.covered_from
    }

    /// When the lock's watch last had a message from etcd, for any waiter (or was
    /// created).
    pub(crate) fn last_message(&self) -> Instant {
        guard(&self.shared.state).last_message
    }

    /// Ends the lock's watch for every waiter on it (each one's [`LockSubscription::next`]
    /// returns `None`; the next waiter creates a new watch): a read found a write to a
    /// waited-on key that the watch, silent all along, never passed on.
    pub(crate) fn distrust(&self) {
        guard(&self.shared.state).end();
    }

    /// etcd's confirmation of the lock's watch (its revision is the watch's start).
    pub(crate) fn created(&self) -> &ResponseHeader {
        &self.shared.created
    }

    /// The next message with an event on this subscription's keys (every event of that
    /// message comes with it, whatever its key), in revision order; `None` once the
    /// watch's stream failed or the watch was cancelled.
    pub(crate) async fn next(&mut self) -> Option<WatchResponse> {
        self.rx.recv().await
    }
}

impl LockWatches {
    /// Joins the locker's watch on the lock of `keys` for writes to `wanted` (keys of
    /// that lock inside its [`LockKeys::wait_range`]), creating the watch on one of the
    /// shared streams of `watches` when the lock has none that is open. Of the messages
    /// the watch kept, those above revision `after` (the state the waiter decided on)
    /// about its keys are passed on first.
    ///
    /// # Errors
    ///
    /// As [`Watches::subscribe`], when a watch has to be created.
    pub(crate) async fn subscribe(
        &self,
        watches: &Watches,
        keys: &LockKeys,
        wanted: Vec<Vec<u8>>,
        after: i64,
    ) -> Result<LockSubscription, etcd_client::Error> {
        let base = keys.base();
        // Whatever way this call ends (joined, failed, or dropped by a timeout while it
        // waited), the lock's slot does not outlive the last watch in it. Declared
        // first, so it runs after the slot's lock below is released.
        let _forget = Forget {
            registry: &self.registry,
            base,
        };
        let mut current = loop {
            let slot = guard(&self.registry)
                .entry(base.to_owned())
                .or_default()
                .clone();
            let current = slot.clone().lock_owned().await;
            // The slot may have been removed (its last watch ended) while this call
            // waited for it: a watch created in it could never be found by others.
            if guard(&self.registry)
                .get(base)
                .is_some_and(|s| Arc::ptr_eq(s, &slot))
            {
                break current;
            }
        };
        if let Some(sub) = current
            .upgrade()
            .and_then(|shared| join(&shared, &wanted, after))
        {
            return Ok(sub);
        }
        let shared = self.create(watches, keys).await?;
        *current = Arc::downgrade(&shared);
        drop(current);
        join(&shared, &wanted, after).ok_or_else(|| {
            etcd_client::Error::WatchError("the lock's watch ended as it was joined".to_owned())
        })
    }

    /// Creates the lock's watch and starts passing its messages on.
    async fn create(
        &self,
        watches: &Watches,
        keys: &LockKeys,
    ) -> Result<Arc<Shared>, etcd_client::Error> {
        let (start, end) = keys.wait_range();
        let inner = watches
            .subscribe(vec![(
                start.into_bytes(),
                WatchOptions::new().with_range(end),
            )])
            .await?;
        let created = inner
            .created()
            .and_then(|hs| hs.first().cloned())
            .ok_or_else(|| {
                etcd_client::Error::WatchError("a watch confirmed without a header".to_owned())
            })?;
        let state = Arc::new(Mutex::new(State {
            open: true,
            covered: created.revision(),
            last_message: Instant::now(),
            recent: VecDeque::new(),
            subscribers: HashMap::new(),
            by_key: HashMap::new(),
            next_id: 0,
        }));
        Ok(Arc::new(Shared {
            base: keys.base().to_owned(),
            state: state.clone(),
            created,
            registry: Arc::downgrade(&self.registry),
            task: tokio::spawn(pass_on(inner, state)),
        }))
    }
}

/// Runs [`forget_if_unused`] when dropped.
struct Forget<'a> {
    registry: &'a Registry,
    base: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        forget_if_unused(self.registry, self.base);
    }
}

/// Removes the lock's slot from the registry when no watch is alive in it and no waiter
/// is creating one.
fn forget_if_unused(registry: &Registry, base: &str) {
    let mut r = guard(registry);
    let unused = r
        .get(base)
        .is_some_and(|slot| slot.try_lock().is_ok_and(|w| w.strong_count() == 0));
    if unused {
        r.remove(base);
    }
}

/// Adds a subscriber for `wanted` to an open watch, with the kept messages about its
/// keys above revision `after`; `None` if the watch has ended.
fn join(shared: &Arc<Shared>, wanted: &[Vec<u8>], after: i64) -> Option<LockSubscription> {
    let mut s = guard(&shared.state);
    if !s.open {
        return None;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    // Kept messages are in revision order: only the newest few are above `after`.
    let above = s
        .recent
        .iter()
        .rev()
        .take_while(|(rev, _)| *rev > after)
        .count();
    for (_, msg) in s.recent.iter().skip(s.recent.len() - above) {
        let touches = msg
            .events()
            .iter()
            .filter_map(|e| e.kv())
            .any(|kv| wanted.iter().any(|k| k.as_slice() == kv.key()));
        if touches {
            let _ = tx.send(msg.clone());
        }
    }
    let id = s.next_id;
    s.next_id += 1;
    for key in wanted {
        s.by_key.entry(key.clone()).or_default().push(id);
    }
    s.subscribers.insert(
        id,
        Subscriber {
            keys: wanted.to_vec(),
            tx,
        },
    );
    let covered_from = s.covered;
    Some(LockSubscription {
        shared: shared.clone(),
        id,
        covered_from,
        rx,
    })
}

/// Passes each message of the lock's watch to the subscribers whose keys it touches,
/// and keeps the latest; when the watch ends, ends every subscription.
async fn pass_on(mut inner: Subscription, state: Arc<Mutex<State>>) {
    while let Some(msg) = inner.next().await {
        if msg.canceled() {
            break;
        }
        let mut s = guard(&state);
        s.last_message = Instant::now();
        let Some(rev) = msg
            .events()
            .iter()
            .filter_map(|e| e.kv())
            .map(|kv| kv.mod_revision())
            .max()
        else {
            continue;
        };
        for id in s.wanting(&msg) {
            if let Some(sub) = s.subscribers.get(&id) {
                let _ = sub.tx.send(msg.clone());
            }
        }
        s.recent.push_back((rev, msg));
        if s.recent.len() > RECENT {
            if let Some((dropped, _)) = s.recent.pop_front() {
                s.covered = s.covered.max(dropped);
            }
        }
    }
    guard(&state).end();
}

#[cfg(test)]
mod etcd_tests;
