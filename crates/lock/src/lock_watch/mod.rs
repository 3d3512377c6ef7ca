//! One etcd watch per lock per locker, shared by every waiter of the locker on that lock.
//!
//! A waiter waits for a few keys of its lock: its predecessor's waiter and hold keys, and
//! its own hold key (a hand-over). Each wait used to add watches of its own on those keys
//! and cancel them when it ended; at 64 clients on one lock that was three watch creates
//! and three cancels per cycle, and etcd 3.4 copies its write buffer for every watch it
//! creates (`readView.Rev`, about a tenth of its CPU in that run; BENCHMARKS.md, section
//! 4). Here the first waiter of the locker on a lock creates one watch on the lock's
//! waiter and hold keys (`[h/, q/]`, the range of [`palisade_api::keys::LockKeys::wait_range`]),
//! on one of the shared streams of [`crate::watches`]; every later waiter of the locker
//! on that lock joins it, with no round trip to etcd, and the watch is cancelled when the
//! last of them leaves.
//!
//! **Joining late, missing nothing.** A waiter decides on a view of the lock read at some
//! revision `V`, and needs every write to its keys after `V`. A shared watch that has run
//! for a while may already have passed such writes along before the waiter joined, so
//! the watch keeps its latest messages ([`RECENT`] of them) and gives a joining waiter
//! those about its keys above `V`. What a [`LockSubscription`] promises is stated by
//! [`LockSubscription::covered_from`]: every write to its keys at a revision above it is
//! passed on, from the kept messages or as it comes. A waiter whose view is at or above
//! that revision decides on the view; one whose view is older (a watch created after the
//! view, or kept messages trimmed past it) reads its keys first, as a wait on a watch of
//! its own did (see `wait_released` in the waiter loop).
//!
//! A locker with waiters on a lock so receives every write to the lock's hold and waiter
//! keys, and wakes only the waiters whose keys a write touches. This assumes lockers are
//! few (a process, a replica of the lock service): etcd sends each write to one watcher
//! per locker with waiters on the lock, where a watch per waiter sent it to the one or
//! two waiters it concerned.
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
mod etcd_tests {
    use std::time::Duration;

    use etcd_client::{Client, EventType};
    use palisade_testkit::EtcdCluster;

    use super::*;
    use palisade_api::keys::RootKeys;

    /// The revisions of the events of `msg`, with their keys' last segment.
    fn events(msg: &WatchResponse) -> Vec<(i64, EventType, String)> {
        msg.events()
            .iter()
            .filter_map(|e| {
                Some((
                    e.kv()?.mod_revision(),
                    e.event_type(),
                    e.kv()?.key_str().ok()?.rsplit('/').next()?.to_owned(),
                ))
            })
            .collect()
    }

    async fn next(sub: &mut LockSubscription) -> Vec<(i64, EventType, String)> {
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("a message within 5 s")
            .expect("the watch is open");
        events(&msg)
    }

    /// Messages that have already arrived.
    fn ready(sub: &mut LockSubscription) -> Vec<Vec<(i64, EventType, String)>> {
        std::iter::from_fn(|| sub.rx.try_recv().ok())
            .map(|m| events(&m))
            .collect()
    }

    #[tokio::test]
    async fn etcd_waiters_of_a_lock_share_one_watch_and_a_late_one_gets_what_it_missed() {
        let cluster = EtcdCluster::single().await;
        let client = Client::connect(cluster.endpoints(), None).await.unwrap();
        let root = RootKeys::new("/t/");
        let keys = root.lock("n", "c", "k");
        let watches = Watches::new(client.clone(), root.epoch(), Duration::from_secs(2));
        let lw = LockWatches::default();
        let (hold, waiter) = (
            format!("{}x/1", keys.holds()),
            format!("{}x/2", keys.queue()),
        );
        let watchers = || cluster.metric(0, "etcd_debugging_mvcc_watcher_total", "");

        let mut a = lw
            .subscribe(&watches, &keys, vec![hold.clone().into_bytes()], 0)
            .await
            .unwrap();
        let start = a.covered_from();
        assert_eq!(start, a.created().revision());
        // The stream's first watch, and the lock's.
        assert_eq!(watchers().await, 2.0);

        let mut kv = client.kv_client();
        let r1 = kv
            .put(hold.as_str(), "a", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let r2 = kv
            .put(waiter.as_str(), "b", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let r3 = kv
            .delete(hold.as_str(), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        // A grant record and a key of another lock are outside the watch.
        kv.put(format!("{}x/1", keys.grants()), "g", None)
            .await
            .unwrap();
        kv.put(
            format!("{}x/1", root.lock("n", "c", "kq").holds()),
            "o",
            None,
        )
        .await
        .unwrap();
        // A sees the writes to its key only, in order.
        assert_eq!(
            next(&mut a).await,
            vec![(r1, EventType::Put, "1".to_owned())]
        );
        assert_eq!(
            next(&mut a).await,
            vec![(r3, EventType::Delete, "1".to_owned())]
        );

        // B joins after all that, with no round trip: it is handed what it missed on
        // its keys, and the promise still reaches back to the watch's start.
        let mut b = lw
            .subscribe(
                &watches,
                &keys,
                vec![hold.clone().into_bytes(), waiter.clone().into_bytes()],
                0,
            )
            .await
            .unwrap();
        assert_eq!(b.covered_from(), start);
        let replayed = ready(&mut b);
        assert_eq!(
            replayed,
            vec![
                vec![(r1, EventType::Put, "1".to_owned())],
                vec![(r2, EventType::Put, "2".to_owned())],
                vec![(r3, EventType::Delete, "1".to_owned())],
            ]
        );
        assert_eq!(watchers().await, 2.0, "B shares A's watch");
        // One that decided on the state at r2 is passed on only what came after it.
        let mut b2 = lw
            .subscribe(&watches, &keys, vec![hold.clone().into_bytes()], r2)
            .await
            .unwrap();
        assert_eq!(
            ready(&mut b2),
            vec![vec![(r3, EventType::Delete, "1".to_owned())]]
        );
        drop(b2);
        {
            let st = guard(&a.shared.state);
            assert_eq!(
                st.by_key.get(hold.as_bytes()).map(Vec::len),
                Some(2),
                "A and B on the hold key"
            );
            assert_eq!(
                st.by_key.get(waiter.as_bytes()).map(Vec::len),
                Some(1),
                "B on the waiter key"
            );
            assert_eq!(st.by_key.len(), 2);
        }
        assert!(ready(&mut a).is_empty(), "A got nothing it did not ask for");

        // Once more than RECENT messages went by, a late joiner is told how far back
        // the kept messages reach: the newest one dropped.
        let mut last = r3;
        let mut revs = Vec::new();
        for i in 0..RECENT + 3 {
            last = kv
                .put(waiter.as_str(), format!("{i}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            revs.push(last);
        }
        loop {
            if next(&mut b).await.first().map(|e| e.0) == Some(last) {
                break;
            }
        }
        let mut c = lw
            .subscribe(&watches, &keys, vec![waiter.clone().into_bytes()], 0)
            .await
            .unwrap();
        // Kept: the last RECENT messages with events (r1 to r3 and the first puts gone).
        let kept = ready(&mut c);
        assert_eq!(kept.len(), RECENT);
        assert_eq!(kept.first().unwrap()[0].0, revs[3]);
        assert_eq!(c.covered_from(), revs[2]);

        // The last to leave cancels the watch in etcd; the next waiter creates another.
        drop((a, b, c));
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while watchers().await != 1.0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(watchers().await, 1.0, "the lock's watch is cancelled");
        assert!(guard(&lw.registry).is_empty(), "and forgotten");
        let d = lw
            .subscribe(&watches, &keys, vec![hold.into_bytes()], 0)
            .await
            .unwrap();
        assert!(d.covered_from() >= last);
        // On the next shared stream, which opens with a first watch of its own.
        assert_eq!(watchers().await, 3.0);
    }

    /// The lock's watch in `locker`, once `n` waiters are on it.
    async fn with_waiters(locker: &crate::Locker, base: &str, n: usize) -> Arc<Shared> {
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let slot = guard(&locker.inner.lock_watches.registry)
                .get(base)
                .cloned();
            let shared = slot.and_then(|s| s.try_lock().ok().and_then(|w| w.upgrade()));
            if let Some(shared) = shared.filter(|s| guard(&s.state).subscribers.len() == n) {
                return shared;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "{n} waiters never joined the lock's watch"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn etcd_a_waiter_on_a_silent_lock_watch_reads_its_keys_and_the_watch_is_made_anew() {
        use crate::{
            FileEpochStore, LockClass, LockName, Locker, LockerOptions, Mode, Namespace, SpiffeId,
        };
        let cluster = EtcdCluster::single().await;
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(500);
        let options = LockerOptions::new(cluster.endpoints()).with_request_timeout(timeout);
        let locker = Locker::connect(options, FileEpochStore::new(dir.path().join("epoch.json")))
            .await
            .unwrap();
        locker
            .config()
            .put_namespace(&Namespace::new("n", "t"))
            .await
            .unwrap();
        locker
            .config()
            .put_class(&LockClass::new("n", "c", ""))
            .await
            .unwrap();
        let name = LockName::new("n", "c", "k");
        let base = locker.inner.keys.lock("n", "c", "k").base().to_owned();
        let session = || async {
            let id = SpiffeId::new("spiffe://test/w").unwrap();
            locker
                .open_session(id, Duration::from_secs(20))
                .await
                .unwrap()
        };
        let (a, b, c) = (session().await, session().await, session().await);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        let waiter = |s: &crate::Session| {
            let (l, s, n) = (locker.clone(), s.clone(), name.clone());
            tokio::spawn(async move { l.acquire(&s, &n, Mode::Exclusive, deadline).await })
        };
        let quiet = timeout * QUIET_TIMEOUTS;

        // B waits on A's hold; then the lock's watch goes silent: its task is gone, so
        // nothing is passed on and nothing ends.
        let ha = locker
            .acquire(&a, &name, Mode::Exclusive, deadline)
            .await
            .unwrap();
        let wb = waiter(&b);
        let silent = with_waiters(&locker, &base, 1).await;
        silent.task.abort();
        let released = tokio::time::Instant::now();
        ha.release().await.unwrap();
        // B finds the release by reading its keys once the watch was quiet long enough,
        // and ends the watch it no longer trusts.
        let hb = tokio::time::timeout(quiet * 3, wb)
            .await
            .expect("B granted after a quiet period")
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() >= quiet / 2,
            "B was woken by something else: {:?}",
            released.elapsed()
        );
        assert!(!guard(&silent.state).open, "the silent watch was ended");

        // C's wait creates a new watch, which passes B's release on at once.
        let wc = waiter(&c);
        let fresh = with_waiters(&locker, &base, 1).await;
        assert!(!Arc::ptr_eq(&fresh, &silent));
        let released = tokio::time::Instant::now();
        hb.release().await.unwrap();
        let hc = tokio::time::timeout(quiet / 2, wc)
            .await
            .expect("C granted through the new watch")
            .unwrap()
            .unwrap();
        assert!(released.elapsed() < quiet / 2);
        hc.release().await.unwrap();
    }
}
