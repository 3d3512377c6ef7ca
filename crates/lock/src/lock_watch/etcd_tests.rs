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
