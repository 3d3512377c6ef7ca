//! Fencing tokens (epoch and grant revision, strictly increasing) and the FIFO order in
//! which waiters are granted, read from etcd's history rather than guessed from timing,
//! also when the waiters of one locker share its watch of the lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};
use palisade_lock::{EpochStore, FencingToken, FileEpochStore, LockName, Locker, Mode};
use tokio::time::Instant;

use crate::support::{
    base, fixture, keys_under, lock, revision, secs, session, token, PrefixWatch, ROOT,
};

/// Enqueues `n` exclusive waiters on `name` (key `key`), each with its own session of
/// `ttl_secs`, one after another (each returns once its waiter key exists). Each, once
/// granted, records `(its index, its token)` and releases.
async fn queue_recording_waiters(
    locker: &Locker,
    name: &LockName,
    key: &str,
    n: usize,
    ttl_secs: u64,
) -> (
    Vec<tokio::task::JoinHandle<()>>,
    Arc<Mutex<Vec<(usize, FencingToken)>>>,
) {
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let s = session(locker, ttl_secs).await;
        let mut watch = PrefixWatch::start(locker.client(), &format!("{}q/", base(key))).await;
        let (l, nm, g) = (locker.clone(), name.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let h = l.acquire(&s, &nm, Mode::Exclusive, secs(60)).await.unwrap();
            g.lock().unwrap().push((i, token(&h)));
            h.release().await.unwrap();
        }));
        watch.next(EventType::Put).await;
    }
    (tasks, granted)
}

/// That the waiters of [`queue_recording_waiters`] were granted in enqueue order, each
/// with a token above the one before (the first above `t0`).
fn assert_granted_in_order(
    granted: &Mutex<Vec<(usize, FencingToken)>>,
    n: usize,
    t0: FencingToken,
) {
    let granted = granted.lock().unwrap().clone();
    let order: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        (0..n).collect::<Vec<_>>(),
        "grant order is enqueue order"
    );
    let mut prev = t0;
    for (i, t) in granted {
        assert!(t > prev, "waiter {i}: token {t} not above {prev}");
        prev = t;
    }
}

#[tokio::test]
async fn etcd_tokens_are_epoch_and_grant_revision_and_strictly_increase() {
    let f = fixture(1).await;
    let s = session(&f.locker, 10).await;
    let before = revision(f.locker.client()).await;
    let h1 = f
        .locker
        .acquire(&s, &lock("k1"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let t1 = token(&h1);
    // Uncontended: exactly one write (the grant Txn) since `before`.
    assert_eq!(t1.revision().get(), (before + 1) as u64);
    assert_eq!(t1.epoch().get(), 0);
    assert_eq!(t1.get(), (before + 1) as u64, "epoch 0: token = grant_rev");
    assert_eq!(h1.grant_rev(), Some(t1.revision()));
    // The durable record outside etcd already reserves this grant revision.
    let durable = FileEpochStore::new(f.dir.path().join("epoch.json"))
        .load()
        .await
        .unwrap()
        .unwrap();
    assert!(durable.reserved_rev >= t1.revision());
    // The hold key's create revision is the token's revision; its value names the holder.
    let hold_key = format!("{}h/x/{}", base("k1"), s.lease());
    let kv = f
        .locker
        .client()
        .clone()
        .get(hold_key.as_str(), None)
        .await
        .unwrap();
    let kv = &kv.kvs()[0];
    assert_eq!(kv.create_revision() as u64, t1.revision().get());
    assert_eq!(kv.lease(), s.lease().get());
    assert!(kv.value_str().unwrap().contains("spiffe://test/worker"));
    h1.release().await.unwrap();

    let mut last = t1;
    for key in ["k1", "k2", "k1", "k3"] {
        let h = f
            .locker
            .acquire(&s, &lock(key), Mode::Exclusive, secs(5))
            .await
            .unwrap();
        assert!(token(&h) > last, "{key}: {} after {last}", token(&h));
        last = token(&h);
        h.release().await.unwrap();
    }
    // Release is one Txn that removed the hold and its grant record.
    assert_eq!(
        keys_under(f.locker.client(), &format!("{ROOT}locks/")).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn etcd_twenty_waiters_are_granted_in_create_revision_order() {
    let f = fixture(1).await;
    let holder = session(&f.locker, 10).await;
    let name = lock("fifo");
    let first = f
        .locker
        .acquire(&holder, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let (tasks, granted) = queue_recording_waiters(&f.locker, &name, "fifo", 20, 10).await;
    // The queue as etcd holds it: 20 waiters in the order they enqueued, one holder.
    let state = f.locker.lock_state(&name).await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].lease, holder.lease());
    assert_eq!(state.holders[0].token, token(&first));
    assert_eq!(state.waiters.len(), 20);
    assert!(state
        .waiters
        .windows(2)
        .all(|w| w[0].create_rev < w[1].create_rev));
    let t0 = token(&first);
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_granted_in_order(&granted, 20, t0);
}

/// One event of a lock's history: (type, key, revision, create revision).
type LockEvent = (EventType, String, i64, i64);

/// Watches everything under `prefix` from the current revision + 1, with each event's
/// create revision (a put's; 0 for a delete).
async fn history_watch(
    client: &Client,
    prefix: &str,
) -> (etcd_client::Watcher, etcd_client::WatchStream) {
    let from = revision(client).await + 1;
    client
        .clone()
        .watch(
            prefix,
            Some(WatchOptions::new().with_prefix().with_start_revision(from)),
        )
        .await
        .unwrap()
}

/// Events of `stream` until `holds_ended` hold keys were deleted.
async fn history_until(
    stream: &mut etcd_client::WatchStream,
    holds_ended: usize,
) -> Vec<LockEvent> {
    let mut seen = Vec::new();
    let mut ended = 0;
    let wait = async {
        while ended < holds_ended {
            let resp = stream.message().await.unwrap().expect("watch stream open");
            for e in resp.events() {
                let kv = e.kv().unwrap();
                let key = kv.key_str().unwrap().to_owned();
                if e.event_type() == EventType::Delete && key.contains("/h/") {
                    ended += 1;
                }
                seen.push((e.event_type(), key, kv.mod_revision(), kv.create_revision()));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("the lock's events within 60 s");
    seen
}

/// Replays a lock's exclusive history and checks every grant: at most one hold at any
/// revision; a grant either finds the queue empty (one Txn) or deletes the waiter key
/// that was first in the queue (lowest create revision) in the revision that creates
/// the hold. Returns the grants as (revision, lease) in order.
fn check_fifo(base: &str, events: &[LockEvent]) -> Vec<(i64, String)> {
    use std::collections::BTreeMap;
    let (q, h) = (format!("{base}q/x/"), format!("{base}h/x/"));
    // waiter lease -> create revision; holds by lease.
    let mut queue: BTreeMap<String, i64> = BTreeMap::new();
    let mut holds: Vec<String> = Vec::new();
    let mut grants = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let rev = events[i].2;
        let batch: Vec<&LockEvent> = events[i..].iter().take_while(|e| e.2 == rev).collect();
        i += batch.len();
        let before = queue.clone();
        for (kind, key, _, create) in &batch {
            if let Some(lease) = key.strip_prefix(&q) {
                match kind {
                    EventType::Put => {
                        queue.insert(lease.to_owned(), *create);
                    }
                    EventType::Delete => {
                        queue.remove(lease);
                    }
                }
            }
        }
        for (kind, key, _, _) in &batch {
            let Some(lease) = key.strip_prefix(&h) else {
                continue;
            };
            match kind {
                EventType::Delete => holds.retain(|l| l != lease),
                EventType::Put => {
                    assert!(
                        holds.is_empty(),
                        "rev {rev}: {lease} granted while {holds:?} hold"
                    );
                    holds.push(lease.to_owned());
                    let first = before
                        .iter()
                        .min_by_key(|(_, c)| **c)
                        .map(|(l, _)| l.clone());
                    match first {
                        None => {}
                        Some(first) => {
                            assert_eq!(
                                first, lease,
                                "rev {rev}: granted {lease}, first in queue {first}"
                            );
                            assert!(
                                !queue.contains_key(lease),
                                "rev {rev}: the grant deletes the waiter key"
                            );
                        }
                    }
                    grants.push((rev, lease.to_owned()));
                }
            }
        }
    }
    grants
}

#[tokio::test]
async fn etcd_sixteen_contending_acquirers_are_granted_fifo_with_rising_tokens() {
    let f = fixture(1).await;
    let name = lock("contend");
    let (_w, mut stream) = history_watch(f.locker.client(), &base("contend")).await;
    const CLIENTS: usize = 16;
    const CYCLES: usize = 6;
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let s = session(&f.locker, 10).await;
        let (l, n, inside, tokens) = (
            f.locker.clone(),
            name.clone(),
            inside.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..CYCLES {
                let h = l.acquire(&s, &n, Mode::Exclusive, secs(60)).await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokens
                    .lock()
                    .unwrap()
                    .push((token(&h), s.lease().to_string()));
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                h.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let events = history_until(&mut stream, CLIENTS * CYCLES).await;
    let grants = check_fifo(&base("contend"), &events);
    assert_eq!(grants.len(), CLIENTS * CYCLES);
    // The tokens handed out are exactly the grant revisions (epoch 0), to the lease that
    // the hold key names; so in grant order each is above the previous holder's.
    let mut tokens = tokens.lock().unwrap().clone();
    tokens.sort();
    let want: Vec<(u64, String)> = grants.iter().map(|(r, l)| (*r as u64, l.clone())).collect();
    let got: Vec<(u64, String)> = tokens.iter().map(|(t, l)| (t.get(), l.clone())).collect();
    assert_eq!(got, want);
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
    // Most grants went through the queue (contention really happened).
    let queued = events
        .iter()
        .filter(|e| e.0 == EventType::Delete && e.1.contains("/q/x/"))
        .count();
    assert!(
        queued >= CLIENTS * CYCLES / 2,
        "only {queued} grants from the queue"
    );
    assert_eq!(
        keys_under(f.locker.client(), &format!("{}q/", base("contend"))).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn etcd_waiters_of_one_locker_share_its_watch_streams_which_survive_a_member_restart() {
    let mut f = fixture(1).await;
    let name = lock("shared-watch");
    let h = session(&f.locker, 20).await;
    let held = f
        .locker
        .acquire(&h, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let (tasks, granted) = queue_recording_waiters(&f.locker, &name, "shared-watch", 8, 20).await;
    // Every wait is set up, on one watch of the lock shared by the eight waiters: with
    // the class cache's watch and the shared stream's first watch, 3 watches on 2
    // streams (the class cache's and one shared stream), where a watch per wait made
    // 28 (2 + 7 x 3, plus 5) and a stream per wait 9 streams.
    let until = Instant::now() + Duration::from_secs(10);
    let (mut watchers, mut streams);
    loop {
        watchers = f
            .cluster
            .metric(0, "etcd_debugging_mvcc_watcher_total", "")
            .await;
        streams = f
            .cluster
            .metric(0, "etcd_debugging_mvcc_watch_stream_total", "")
            .await;
        if (watchers == 3.0 && streams == 2.0) || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(watchers, 3.0, "{watchers} watchers: not one for the lock");
    assert_eq!(
        streams, 2.0,
        "{streams} watch streams for {watchers} watchers"
    );
    // The member restarts: the shared stream fails, every waiter reads again, and one of
    // them creates the lock's watch anew on another stream; none is granted while the
    // lock is held.
    f.cluster.stop(0).await;
    f.cluster.restart(0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        granted.lock().unwrap().is_empty(),
        "granted while the lock is held"
    );
    let t0 = token(&held);
    held.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("every waiter granted after the release")
            .unwrap();
    }
    assert_granted_in_order(&granted, 8, t0);
    let streams = f
        .cluster
        .metric(0, "etcd_debugging_mvcc_watch_stream_total", "")
        .await;
    assert!(
        streams <= 5.0,
        "{streams} watch streams once every waiter is done"
    );
}
