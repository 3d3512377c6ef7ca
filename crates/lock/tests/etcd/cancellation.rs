//! Acquires cut short by their deadline or dropped by the caller, and dropped holds: no
//! waiter, hold or grant key is left behind, and nobody queued behind them is stalled.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType};
use palisade_lock::{LockName, Locker, Mode};
use tokio::time::Instant;

use crate::support::{
    base, fixture, keys_under, lock, revision, secs, session, spawn_waiter, token, within,
    PrefixWatch, NS, ROOT,
};

#[tokio::test]
async fn etcd_deadline_or_dropped_acquire_leaves_no_waiter_key() {
    let f = fixture(1).await;
    let name = lock("dl");
    let h = session(&f.locker, 10).await;
    let held = f
        .locker
        .acquire(&h, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let w = session(&f.locker, 10).await;
    let queue = format!("{}q/", base("dl"));

    let started = Instant::now();
    let err = f
        .locker
        .acquire(
            &w,
            &name,
            Mode::Exclusive,
            within(Duration::from_millis(400)),
        )
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(2500));
    assert!(
        keys_under(f.locker.client(), &queue).await.is_empty(),
        "timed-out waiter removed its key"
    );

    // A dropped acquire future: the drop guard deletes the waiter key.
    let mut watch = PrefixWatch::start(f.locker.client(), &queue).await;
    let mut acquire = Box::pin(f.locker.acquire(&w, &name, Mode::Exclusive, secs(30)));
    tokio::select! {
        _ = &mut acquire => panic!("must not be granted"),
        put = watch.next(EventType::Put) => assert!(put.0.ends_with(&w.lease().to_string())),
    }
    drop(acquire);
    watch.next(EventType::Delete).await;
    assert!(
        keys_under(f.locker.client(), &queue).await.is_empty(),
        "dropped waiter removed its key"
    );
    // And the session can acquire the lock again afterwards.
    let held_token = token(&held);
    held.release().await.unwrap();
    let again = f
        .locker
        .acquire(&w, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert!(token(&again) > held_token);
}

/// Keys of the locks under `prefix` (a key prefix inside class `c` of `ns`) that are
/// holds, grant records or waiters; waits up to 5 s for background cleanups to finish.
async fn lock_keys_left(client: &Client, key_prefix: &str) -> Vec<String> {
    let under = format!("{ROOT}locks/{NS}/c/{}", key_prefix.replace('/', "%2F"));
    let started = Instant::now();
    loop {
        let left: Vec<String> = keys_under(client, &under)
            .await
            .into_iter()
            .filter(|k| ["/q/", "/h/", "/g/"].iter().any(|s| k.contains(s)))
            .collect();
        if left.is_empty() || started.elapsed() > Duration::from_secs(5) {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every lock is free at once for a fresh session.
async fn all_acquirable_at_once(locker: &Locker, names: &[LockName]) {
    let fresh = session(locker, 30).await;
    for name in names {
        let h = locker
            .acquire(
                &fresh,
                name,
                Mode::Exclusive,
                within(Duration::from_secs(2)),
            )
            .await
            .unwrap_or_else(|e| panic!("{name:?} is not free: {e:?}"));
        h.release().await.unwrap();
    }
    fresh.close().await.unwrap();
}

#[tokio::test]
async fn etcd_acquire_dropped_while_its_first_txn_is_in_flight_leaves_no_keys() {
    let f = fixture(1).await;
    let s = session(&f.locker, 30).await;
    let mut names = Vec::new();
    // Uncontended: the first Txn grants. Dropped at varied moments around its flight.
    for i in 0..300u64 {
        let name = lock(&format!("drop/g{i}"));
        let us = (i * 7919) % 3000;
        let acquire = f.locker.acquire(&s, &name, Mode::Exclusive, secs(5));
        if let Ok(r) = tokio::time::timeout(Duration::from_micros(us), acquire).await {
            r.unwrap().release().await.unwrap();
        }
        names.push(name);
    }
    // Contended: the first Txn enqueues (another session holds the lock).
    let other = session(&f.locker, 30).await;
    let mut held = Vec::new();
    for i in 0..150u64 {
        let name = lock(&format!("drop/q{i}"));
        held.push(
            f.locker
                .acquire(&other, &name, Mode::Exclusive, secs(5))
                .await
                .unwrap(),
        );
        let us = (i * 7919) % 3000;
        let acquire = f.locker.acquire(&s, &name, Mode::Exclusive, secs(5));
        assert!(tokio::time::timeout(Duration::from_micros(us), acquire)
            .await
            .is_err());
        names.push(name);
    }
    for h in held {
        h.release().await.unwrap();
    }
    // A waiter dropped while its grant Txn may be in flight: the holder releases, and the
    // waiter's future is dropped at varied moments after that.
    for i in 0..100u64 {
        let name = lock(&format!("drop/w{i}"));
        let h = f
            .locker
            .acquire(&other, &name, Mode::Exclusive, secs(5))
            .await
            .unwrap();
        let mut acquire = Box::pin(f.locker.acquire(&s, &name, Mode::Exclusive, secs(10)));
        // Drive the acquire until its waiter key is in etcd.
        loop {
            tokio::select! {
                r = &mut acquire => panic!("granted while held: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
            }
            if f.locker.lock_state(&name).await.unwrap().waiters.len() == 1 {
                break;
            }
        }
        h.release().await.unwrap();
        let us = (i * 7919) % 4000;
        if let Ok(r) = tokio::time::timeout(Duration::from_micros(us), &mut acquire).await {
            r.unwrap().release().await.unwrap();
        }
        drop(acquire);
        names.push(name);
    }
    let left = lock_keys_left(f.locker.client(), "drop/").await;
    assert!(left.is_empty(), "dropped attempts left keys: {left:?}");
    all_acquirable_at_once(&f.locker, &names).await;
}

#[test]
fn etcd_dropped_hold_can_be_acquired_again_at_once_on_a_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let f = fixture(1).await;
        let s = session(&f.locker, 10).await;
        for mode in [Mode::Exclusive, Mode::Shared] {
            let name = lock(&format!("redrop-{mode:?}"));
            let mut last = f.locker.acquire(&s, &name, mode, secs(5)).await.unwrap();
            for _ in 0..10 {
                let old = token(&last);
                drop(last);
                last = f
                    .locker
                    .acquire(&s, &name, mode, secs(5))
                    .await
                    .unwrap_or_else(|e| panic!("re-acquire after drop: {e:?}"));
                assert!(token(&last) > old);
            }
            // The background release of the dropped holds never touched the new hold:
            // after one more etcd round trip on the same client (the releases were sent
            // before it), the hold key is still the last grant's.
            let _ = f.locker.lock_state(&name).await.unwrap();
            tokio::task::yield_now().await;
            let state = f.locker.lock_state(&name).await.unwrap();
            assert_eq!(state.holders.len(), 1, "{state:?}");
            assert_eq!(state.holders[0].token, token(&last));
            last.release().await.expect("still held");
        }
    });
}

#[tokio::test]
async fn etcd_cancelled_waits_under_contention_leave_no_waiter_key_and_never_stall_the_queue() {
    let f = fixture(1).await;
    let name = lock("cancel");
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let s = session(&f.locker, 10).await;
        let (l, n, done) = (f.locker.clone(), name.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..5 {
                let h = l.acquire(&s, &n, Mode::Exclusive, secs(60)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                h.release().await.unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }));
    }
    let mut quitters = Vec::new();
    for i in 0..8u64 {
        let s = session(&f.locker, 10).await;
        let (l, n) = (f.locker.clone(), name.clone());
        quitters.push(tokio::spawn(async move {
            let mut outcomes = (0, 0);
            for j in 0..6u64 {
                let wait = Duration::from_millis(20 + (i * 7 + j * 13) % 80);
                if (i + j) % 2 == 0 {
                    // A deadline inside the acquire.
                    match l.acquire(&s, &n, Mode::Exclusive, within(wait)).await {
                        Ok(h) => h.release().await.unwrap(),
                        Err(e) => {
                            // Whether it ran out in a wait or cut an etcd call short,
                            // it is the caller's deadline (etcd is healthy here).
                            assert!(e.is_deadline_exceeded(), "{e:?}");
                            outcomes.0 += 1;
                        }
                    }
                } else {
                    // The caller gives up: the acquire future is dropped mid-wait.
                    match tokio::time::timeout(wait, l.acquire(&s, &n, Mode::Exclusive, secs(60)))
                        .await
                    {
                        Ok(h) => h.unwrap().release().await.unwrap(),
                        Err(_) => outcomes.1 += 1,
                    }
                }
            }
            outcomes
        }));
    }
    let mut gave_up = (0, 0);
    for q in quitters {
        let (a, b) = q.await.unwrap();
        gave_up = (gave_up.0 + a, gave_up.1 + b);
    }
    assert!(
        gave_up.0 > 0 && gave_up.1 > 0,
        "cancellations happened: {gave_up:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), async {
        for w in workers {
            w.await.unwrap();
        }
    })
    .await
    .expect("the workers finish: no cancelled waiter stalls the queue");
    assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 40);
    // The dropped acquires clean up in the background: no key of the lock is left.
    assert_eq!(
        lock_keys_left(f.locker.client(), "cancel").await,
        Vec::<String>::new()
    );
    let s = session(&f.locker, 10).await;
    let before = revision(f.locker.client()).await;
    let h = f
        .locker
        .acquire(&s, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert_eq!(
        token(&h).revision().get(),
        (before + 1) as u64,
        "an empty queue: one Txn"
    );
}

#[tokio::test]
async fn etcd_waiter_whose_predecessor_gives_up_is_granted_on_the_holders_release() {
    let f = fixture(1).await;
    let name = lock("pred");
    let h = session(&f.locker, 10).await;
    let held = f
        .locker
        .acquire(&h, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let p = session(&f.locker, 10).await;
    let pred = spawn_waiter(&f.locker, &p, &name, Mode::Exclusive, secs(30)).await;
    let b = session(&f.locker, 10).await;
    let mut next = spawn_waiter(&f.locker, &b, &name, Mode::Exclusive, secs(30)).await;
    // The predecessor gives up: its waiter key goes, and no hold of its lease comes.
    let mut queue = PrefixWatch::start(f.locker.client(), &format!("{}q/", base("pred"))).await;
    pred.abort();
    let (gone, _) = queue.next(EventType::Delete).await;
    assert!(gone.ends_with(&p.lease().to_string()), "{gone}");
    // B still waits: the lock is held.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut next)
            .await
            .is_err(),
        "granted while the lock is held"
    );
    let t0 = token(&held);
    let released = Instant::now();
    held.release().await.unwrap();
    let hb = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("granted after the release")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    assert!(token(&hb) > t0);
    assert_eq!(
        keys_under(f.locker.client(), &format!("{}q/", base("pred"))).await,
        Vec::<String>::new()
    );
}

/// A deadline that has already passed tries once: a free lock is granted, a held one
/// fails at once with DeadlineExceeded and leaves no waiter key.
#[tokio::test]
async fn etcd_an_acquire_whose_deadline_passed_tries_once() {
    let f = fixture(1).await;
    let (a, b) = (session(&f.locker, 30).await, session(&f.locker, 30).await);
    let name = lock("try");
    let mut tokens = Vec::new();
    for _ in 0..50 {
        let h = f
            .locker
            .acquire(&a, &name, Mode::Exclusive, Instant::now())
            .await
            .unwrap();
        tokens.push(token(&h));
        h.release().await.unwrap();
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let held = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, Instant::now())
        .await
        .unwrap();
    let err = f
        .locker
        .acquire(&b, &name, Mode::Exclusive, Instant::now())
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    let state = f.locker.lock_state(&name).await.unwrap();
    assert!(state.waiters.is_empty(), "{:?}", state.waiters);
    assert_eq!(state.holders[0].token, token(&held));
}
