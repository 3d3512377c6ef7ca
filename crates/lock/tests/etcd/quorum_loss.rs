//! Lost members and lost quorum: never two exclusive holders across a leader election;
//! fail-closed classes refuse and open ones grant unprotected; a caller's deadline or
//! one silent member is no lost quorum.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use palisade_lock::{ErrorKind, FencingToken, LockName, Mode, QuorumPolicy};
use tokio::time::Instant;

use crate::support::{
    base, class, connect, fixture, keys_under, lock, revision, secs, session, token, within, NS2,
};

/// Per acquire: the token and how its release went, or why the acquire failed.
type Outcomes = Arc<Mutex<Vec<Result<(FencingToken, Result<(), ErrorKind>), ErrorKind>>>>;

#[tokio::test]
async fn etcd_leader_killed_during_acquires_never_two_exclusive_holders() {
    let mut f = fixture(3).await;
    let name = lock("ha");
    let start_rev = revision(f.locker.client()).await;
    let results: Outcomes = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (l, n, r, stop) = (
            f.locker.clone(),
            name.clone(),
            results.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let s = session(&l, 5).await;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match l
                    .acquire(&s, &n, Mode::Exclusive, within(Duration::from_secs(2)))
                    .await
                {
                    Ok(h) => {
                        let t = token(&h);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let released = h.release().await;
                        r.lock()
                            .unwrap()
                            .push(Ok((t, released.map_err(|e| e.kind().clone()))));
                    }
                    Err(e) => {
                        let typed =
                            e.is_quorum_lost() || e.is_deadline_exceeded() || e.is_session_lost();
                        assert!(typed, "untyped failure: {e:?}");
                        r.lock().unwrap().push(Err(e.kind().clone()));
                        if e.is_session_lost() {
                            return;
                        }
                    }
                }
            }
        }));
    }
    let grants = |r: &Outcomes| r.lock().unwrap().iter().filter(|x| x.is_ok()).count();
    while grants(&results) < 5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader = f.cluster.leader().await;
    f.cluster.kill(leader);
    let after_kill = grants(&results);
    let wait = async {
        while grants(&results) < after_kill + 15 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("grants resume after the election");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    f.cluster.restart(leader).await;

    // Ground truth from etcd's history: at no revision were there two holds.
    let end_rev = revision(f.locker.client()).await;
    let holds = format!("{}h/", base("ha"));
    let mut c = f.locker.client().clone();
    for rev in start_rev..=end_rev {
        let opts = GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_revision(rev);
        let mut attempts = 0;
        let resp = loop {
            match c.get(holds.as_str(), Some(opts.clone())).await {
                Ok(resp) => break resp,
                Err(e) if attempts < 100 => {
                    attempts += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert!(
            resp.count() <= 1,
            "{} holds at revision {rev}",
            resp.count()
        );
    }
    let results = results.lock().unwrap();
    let mut tokens: Vec<FencingToken> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|(t, _)| *t))
        .collect();
    let n = tokens.len();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "tokens are unique");
    assert!(n >= 20);
}

/// A caller's deadline that runs out during an etcd call, on a healthy cluster, is the
/// caller's deadline, not a lost quorum: it never turns into an unprotected grant of an
/// open class (which would let a second holder in while the first still holds).
#[tokio::test]
async fn etcd_a_deadline_that_cuts_a_call_short_is_no_quorum_loss_and_grants_nothing() {
    let f = fixture(1).await;
    let mut open = class(NS2, "open", "open/");
    open.on_quorum_loss = QuorumPolicy::Open;
    f.locker.config().put_class(&open).await.unwrap();
    let name = LockName::new(NS2, "open", "open/cut");
    let (a, b) = (session(&f.locker, 10).await, session(&f.locker, 10).await);
    // Warm the class cache, then hold the lock.
    f.locker
        .acquire(&b, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert!(held.is_protected());
    let mut cut = 0;
    for i in 0..200u64 {
        // From 50 µs to 5 ms: most of these end inside the enqueue Txn or the cleanup.
        let wait = Duration::from_micros(50 + (i * 25) % 5_000);
        match f
            .locker
            .acquire(&b, &name, Mode::Exclusive, within(wait))
            .await
        {
            Ok(h) => panic!(
                "granted while held (protected: {}) after {wait:?}",
                h.is_protected()
            ),
            Err(e) => {
                assert!(e.is_deadline_exceeded(), "{e:?} after {wait:?}");
                cut += 1;
            }
        }
        // Let the dropped attempt's cleanup finish before the next one.
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(cut, 200);
    held.release().await.unwrap();
}

/// A wait shorter than one request timeout (500 ms here), against a member that does
/// not answer (paused): the wait bounds only the waiting, so the acquire's etcd calls
/// still get their own budget (three request timeouts), and a member silent for all of
/// it is a lost quorum, not a passed deadline. The acquire returns after that budget and
/// one request timeout of cleanup at most, leaving the rest of the cleanup to the
/// background; once etcd answers again nothing of it is left.
#[tokio::test]
async fn etcd_a_short_wait_on_a_silent_member_gets_the_call_budget_and_cleans_up_later() {
    let mut f = fixture(1).await;
    let s = session(&f.locker, 30).await;
    let name = lock("silent");
    // Warm the class cache.
    f.locker
        .acquire(&s, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    f.cluster.pause(0);
    let started = Instant::now();
    let result = f
        .locker
        .acquire(
            &s,
            &name,
            Mode::Exclusive,
            within(Duration::from_millis(200)),
        )
        .await;
    let took = started.elapsed();
    f.cluster.resume(0);
    let err = result.unwrap_err();
    assert!(err.is_quorum_lost(), "{err:?}");
    // Three request timeouts of calls, then one of cleanup at most (2 s), with room
    // for a busy machine: it returns, it does not hang on the silent member.
    assert!(took < Duration::from_secs(5), "returned after {took:?}");
    let h = f
        .locker
        .acquire(&s, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let state = f.locker.lock_state(&name).await.unwrap();
    assert!(state.waiters.is_empty(), "{:?}", state.waiters);
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].token, token(&h));
    h.release().await.unwrap();
}

#[tokio::test]
async fn etcd_quorum_loss_fails_closed_classes_and_gives_open_classes_unprotected_grants() {
    let mut f = fixture(3).await;
    let mut open = class(NS2, "open", "open/");
    open.on_quorum_loss = QuorumPolicy::Open;
    f.locker.config().put_class(&open).await.unwrap();
    let s = session(&f.locker, 10).await;
    // Warm the class cache before quorum goes.
    f.locker
        .acquire(
            &s,
            &LockName::new(NS2, "open", "open/w"),
            Mode::Exclusive,
            secs(5),
        )
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    f.locker
        .acquire(&s, &lock("w"), Mode::Exclusive, secs(5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = f
        .locker
        .acquire(&s, &lock("kept"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let held_token = token(&held);

    let leader = f.cluster.leader().await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    f.cluster.kill(follower);
    f.cluster.kill(leader);

    let started = Instant::now();
    let err = f
        .locker
        .acquire(
            &s,
            &lock("k"),
            Mode::Exclusive,
            within(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert!(err.is_quorum_lost(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_millis(4000),
        "failed after {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let h = f
        .locker
        .acquire(
            &s,
            &LockName::new(NS2, "open", "open/k"),
            Mode::Exclusive,
            within(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(4000));
    assert!(!h.is_protected());
    assert_eq!(h.token(), None);
    h.release().await.unwrap();

    // A release that cannot commit fails typed; once quorum is back, the same session
    // acquires the lock again with a new, higher token (never the old grant again).
    assert!(held.release().await.unwrap_err().is_quorum_lost());
    f.cluster.restart(follower).await;
    f.cluster.restart(leader).await;
    let again = f
        .locker
        .acquire(&s, &lock("kept"), Mode::Exclusive, secs(10))
        .await
        .unwrap();
    assert!(
        token(&again) > held_token,
        "{} vs {held_token}",
        token(&again)
    );
    assert_eq!(
        keys_under(f.locker.client(), &format!("{}h/", base("kept")))
            .await
            .len(),
        1
    );
}

#[tokio::test]
async fn etcd_a_paused_follower_fails_no_first_acquire_of_a_class() {
    let mut f = fixture(3).await;
    // Classes whose first acquire reads the class from etcd (nothing cached yet, nothing
    // to fall back on).
    for i in 0..8 {
        let c = class(NS2, &format!("cold{i}"), &format!("cold{i}/"));
        f.locker.config().put_class(&c).await.unwrap();
    }
    let s = session(&f.locker, 20).await;
    // The follower stops answering but its connections stay up: a request the client
    // sends it gets no answer until its request timeout.
    let follower = f.cluster.follower().await;
    f.cluster.pause(follower);
    let mut holds = Vec::new();
    for i in 0..8 {
        let name = LockName::new(NS2, format!("cold{i}"), format!("cold{i}/k"));
        let h = f.locker.acquire(&s, &name, Mode::Exclusive, secs(20)).await;
        holds.push(h.unwrap_or_else(|e| panic!("first acquire of class cold{i}: {e}")));
    }
    f.cluster.resume(follower);
    for h in holds {
        h.release().await.unwrap();
    }
}

/// An acquire whose first Txn got no answer from a paused member and was sent again
/// (so a copy of it may still arrive) is granted only after its cancel marker is
/// written; nothing falls back on that write, so it too retries on the members that
/// answer up to the caller's deadline, and a paused member of three fails none of these
/// acquires. The locker knows two members, one of them paused, and the client sends
/// each request to one of them at random: about half of the acquires send their first
/// Txn again, and one in eight of those sends its marker to the paused member three
/// times in a row (all the attempts that three request timeouts allow).
#[tokio::test]
async fn etcd_a_paused_follower_fails_no_acquire_whose_first_txn_was_sent_twice() {
    let mut f = fixture(3).await;
    let follower = f.cluster.follower().await;
    let other = (0..3).find(|&i| i != follower).unwrap();
    let locker = connect(
        vec![f.cluster.endpoint(follower), f.cluster.endpoint(other)],
        &f.dir,
    )
    .await
    .unwrap();
    let s = session(&locker, 30).await;
    f.cluster.pause(follower);
    let tasks: Vec<_> = (0..128)
        .map(|i| {
            let (l, s) = (locker.clone(), s.clone());
            tokio::spawn(async move {
                let name = lock(&format!("twice{i}"));
                l.acquire(&s, &name, Mode::Exclusive, secs(20))
                    .await
                    .map_err(|e| format!("acquire of twice{i}: {e}"))
            })
        })
        .collect();
    let mut holds = Vec::new();
    let mut failed = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(h) => holds.push(h),
            Err(e) => failed.push(e),
        }
    }
    f.cluster.resume(follower);
    assert!(
        failed.is_empty(),
        "{} of 128 failed: {failed:?}",
        failed.len()
    );
    let mut tokens: Vec<FencingToken> = holds.iter().map(token).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 128, "tokens are unique");
    for h in holds {
        h.release().await.unwrap();
    }
    // Released: no hold, waiter or grant record left (only the session's cancel markers,
    // `c/`, which end with its lease).
    for i in 0..128 {
        let b = base(&format!("twice{i}"));
        let left: Vec<String> = keys_under(locker.client(), &b)
            .await
            .into_iter()
            .filter(|k| !k[b.len()..].starts_with("c/"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
