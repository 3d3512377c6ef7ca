//! Tiers: two etcd clusters behind one [`Tiers`]. Routing by the directory (wrong-tier
//! answers name the tier), epochs as one sequence across clusters, and rehome: under a
//! steady acquire/release load (tokens of the namespace after the move above every
//! token before it; exclusive holds never overlap), a drain that times out, a target
//! tier that lost its quorum, and a rehome whose driver stopped part way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_lock::{
    EpochReason, ErrorKind, FencingToken, LockName, Locker, Mode, Namespace, Tiers,
};
use palisade_testkit::EtcdCluster;
use tokio::time::Instant;

use crate::support::{class, connect, keys_under, secs, session, token, within, ROOT};

const MOVING: &str = "moving";

struct TwoTiers {
    a: EtcdCluster,
    b: EtcdCluster,
    tiers: Tiers,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// Tier `a` (home) and tier `b`, each a one-member cluster with its own epoch file;
/// namespace `moving` (class `c`, empty prefix) on `a`.
async fn two_tiers() -> TwoTiers {
    let (a, b) = (EtcdCluster::start(1).await, EtcdCluster::start(1).await);
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let la = connect(a.endpoints(), &dirs.0).await.unwrap();
    let lb = connect(b.endpoints(), &dirs.1).await.unwrap();
    let mut ns = Namespace::new(MOVING, "tenant");
    ns.cluster_tier = "a".into();
    la.config().put_namespace(&ns).await.unwrap();
    la.config()
        .put_class(&class(MOVING, "c", ""))
        .await
        .unwrap();
    let tiers = Tiers::new("a", [("a".to_owned(), la), ("b".to_owned(), lb)]).unwrap();
    TwoTiers {
        a,
        b,
        tiers,
        _dirs: dirs,
    }
}

fn moving(key: &str) -> LockName {
    LockName::new(MOVING, "c", key)
}

fn tier<'a>(t: &'a TwoTiers, name: &str) -> &'a Locker {
    t.tiers.locker(name).unwrap()
}

#[tokio::test]
async fn etcd_tiers_route_by_the_directory_and_advance_epochs_above_every_tier() {
    let t = two_tiers().await;
    let (la, lb) = (tier(&t, "a"), tier(&t, "b"));
    // The directory (the home tier's record) says `a`.
    let (_, on) = t.tiers.route(MOVING, "a").await.unwrap();
    assert_eq!(on.epoch().0.cluster_id, t.a.cluster_id().await);
    let err = t.tiers.route(MOVING, "b").await.unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::WrongTier {
            ns: MOVING.into(),
            tier: "a".into()
        }
    );
    assert!(err.to_string().contains("tier a"), "{err}");
    // A record naming no configured tier lives on the home tier.
    let mut stray = Namespace::new("stray", "tenant");
    stray.cluster_tier = "gold".into();
    la.config().put_namespace(&stray).await.unwrap();
    assert_eq!(t.tiers.namespace("stray").await.unwrap().unwrap().0, "a");

    // Epochs: one sequence. `a` goes to 2; `b`'s next is 3, not 1; `a`'s next is 4.
    la.advance_epoch(EpochReason::Restore).await.unwrap();
    la.advance_epoch(EpochReason::Restore).await.unwrap();
    assert_eq!(la.epoch().0.epoch.get(), 2);
    let rb = t
        .tiers
        .advance_epoch("b", EpochReason::Rehome)
        .await
        .unwrap();
    assert_eq!(rb.epoch.get(), 3);
    assert_eq!(rb.cluster_id, t.b.cluster_id().await);
    assert_eq!(rb.reason, EpochReason::Rehome);
    let ra = t
        .tiers
        .advance_epoch("a", EpochReason::Restore)
        .await
        .unwrap();
    assert_eq!(ra.epoch.get(), 4);
    assert_eq!(lb.epoch().0.epoch.get(), 3);

    // One cluster named as two tiers is refused.
    let dir = tempfile::tempdir().unwrap();
    let again = connect(t.a.endpoints(), &dir).await.unwrap();
    let err = Tiers::new("a", [("a".to_owned(), la.clone()), ("x".to_owned(), again)]).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::SameClusterTiers { a, b, .. } if a == "a" && b == "x"),
        "{err:?}"
    );
    let err = t.tiers.locker("nope").unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
}

/// One grant seen by a worker: its token, when the grant returned, when the release
/// was sent.
#[derive(Debug, Clone, Copy)]
struct Seen {
    token: FencingToken,
    granted: Instant,
    released: Instant,
}

#[tokio::test]
async fn etcd_rehome_under_load_orders_tokens_and_never_overlaps_holds() {
    let t = two_tiers().await;
    let seen: Arc<Mutex<Vec<(String, Seen)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (tiers, seen, stop) = (t.tiers.clone(), seen.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            // A session per tier; the worker follows the directory.
            let mut sessions = std::collections::HashMap::new();
            let (mut fenced, mut wrong) = (0u32, 0u32);
            while !stop.load(Ordering::SeqCst) {
                let (tier_name, _) = tiers.namespace(MOVING).await.unwrap().unwrap();
                let locker = tiers.locker(&tier_name).unwrap().clone();
                if !sessions.contains_key(&tier_name) {
                    sessions.insert(tier_name.clone(), session(&locker, 10).await);
                }
                let s = &sessions[&tier_name];
                let key = format!("k{}", w % 2);
                // A short wait: a worker queued on the old tier gives up and follows the
                // directory, so one hold on each tier at once would be seen.
                match locker
                    .acquire(
                        s,
                        &moving(&key),
                        Mode::Exclusive,
                        within(Duration::from_millis(100)),
                    )
                    .await
                {
                    Ok(h) => {
                        let granted = Instant::now();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        let released = Instant::now();
                        let tok = token(&h);
                        h.release().await.unwrap();
                        seen.lock().unwrap().push((
                            key,
                            Seen {
                                token: tok,
                                granted,
                                released,
                            },
                        ));
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::NamespaceFenced { .. }) => {
                        fenced += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WrongTier { .. }) => wrong += 1,
                    Err(e) if e.is_deadline_exceeded() => {}
                    Err(e) => panic!("worker {w}: {e:?}"),
                }
            }
            (fenced, wrong)
        }));
    }
    // Grants counted, not time waited: the machine's load sets the pace.
    let count = |epoch: Option<palisade_lock::Epoch>| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| epoch.is_none_or(|e| s.token.epoch() == e))
            .count()
    };
    let until = Instant::now() + Duration::from_secs(20);
    while count(None) < 10 {
        assert!(
            Instant::now() < until,
            "{} grants before the move",
            count(None)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_move = count(None);
    let a_epoch = tier(&t, "a").epoch().0.epoch;
    // A hold of `k0` on the old tier that outlasts the fence: the move waits for it.
    let la = tier(&t, "a").clone();
    let long_session = session(&la, 10).await;
    let long = la
        .acquire(&long_session, &moving("k0"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let long_hold = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let granted = Instant::now();
            tokio::time::sleep(Duration::from_millis(600)).await;
            let released = Instant::now();
            let tok = token(&long);
            long.release().await.unwrap();
            seen.lock().unwrap().push((
                "k0".to_owned(),
                Seen {
                    token: tok,
                    granted,
                    released,
                },
            ));
        })
    };
    let done = t
        .tiers
        .rehome(MOVING, "b", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((done.from.as_str(), done.to.as_str()), ("a", "b"));
    assert_eq!(done.epoch.cluster_id, t.b.cluster_id().await);
    assert_eq!(done.epoch.reason, EpochReason::Rehome);
    assert!(done.epoch.epoch > a_epoch, "{done:?}");
    let until = Instant::now() + Duration::from_secs(20);
    while count(Some(done.epoch.epoch)) < 10 {
        assert!(
            Instant::now() < until,
            "{} grants on the new tier",
            count(Some(done.epoch.epoch))
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    long_hold.await.unwrap();
    let mut fenced = 0;
    for w in workers {
        fenced += w.await.unwrap().0;
    }
    let seen = seen.lock().unwrap().clone();
    let after_move = seen
        .iter()
        .filter(|(_, s)| s.token.epoch() == done.epoch.epoch)
        .count();
    assert!(before_move >= 10, "{before_move} grants before the move");
    assert!(after_move >= 10, "{after_move} grants on the new tier");
    assert!(fenced > 0, "no acquire met the fence while it drained");
    for key in ["k0", "k1"] {
        let mut holds: Vec<Seen> = seen
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .collect();
        holds.sort_by_key(|s| s.granted);
        for pair in holds.windows(2) {
            // Exclusive: the next grant came after this hold's release was sent, and
            // its token is above (across the two clusters too).
            assert!(pair[1].granted > pair[0].released, "{key}: {pair:?}");
            assert!(pair[1].token > pair[0].token, "{key}: {pair:?}");
        }
    }
    // The old tier stays fenced, the new one serves; the move is over.
    let (_, on) = t.tiers.route(MOVING, "b").await.unwrap();
    assert_eq!(on.epoch().0.cluster_id, t.b.cluster_id().await);
    let la = tier(&t, "a");
    let s = session(la, 10).await;
    let err = la
        .acquire(&s, &moving("k0"), Mode::Exclusive, secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::NamespaceFenced { .. }),
        "{err:?}"
    );
    assert!(keys_under(la.client(), &format!("{ROOT}tier/rehome/"))
        .await
        .is_empty());
    assert!(
        keys_under(tier(&t, "b").client(), &format!("{ROOT}tier/fence/"))
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn etcd_rehome_that_cannot_drain_or_reach_the_new_tier_leaves_the_namespace_home() {
    let mut t = two_tiers().await;
    let la = tier(&t, "a").clone();
    let s = session(&la, 10).await;
    let held = la
        .acquire(&s, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    // A hold that outlives the drain: rolled back, nothing moved.
    let err = t
        .tiers
        .rehome(MOVING, "b", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::DrainTimeout {
            ns: MOVING.into(),
            holds: 1,
            waiters: 0
        }
    );
    let before = token(&held);
    held.release().await.unwrap();
    assert_eq!(t.tiers.namespace(MOVING).await.unwrap().unwrap().0, "a");
    let h = la
        .acquire(&s, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert!(token(&h) > before);
    h.release().await.unwrap();

    // The new tier lost its quorum: rolled back, the namespace grants on `a` again.
    t.b.kill(0);
    let err = t
        .tiers
        .rehome(MOVING, "b", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_quorum_lost(), "{err:?}");
    assert_eq!(t.tiers.namespace(MOVING).await.unwrap().unwrap().0, "a");
    let h = la
        .acquire(&s, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let last_on_a = token(&h);
    h.release().await.unwrap();
    // Back up, the same rehome completes.
    t.b.restart(0).await;
    let done = t
        .tiers
        .rehome(MOVING, "b", Duration::from_secs(5))
        .await
        .unwrap();
    let lb = tier(&t, "b");
    let sb = session(lb, 10).await;
    let h = lb
        .acquire(&sb, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert!(token(&h) > last_on_a, "{} vs {last_on_a}", token(&h));
    assert_eq!(token(&h).epoch(), done.epoch.epoch);
}

#[tokio::test]
async fn etcd_rehome_stopped_part_way_refuses_on_both_tiers_then_completes_on_retry() {
    let t = two_tiers().await;
    let la = tier(&t, "a").clone();
    let s = session(&la, 10).await;
    let held = la
        .acquire(&s, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let before = token(&held);
    // The driver stops while it drains (its process was killed).
    let tiers = t.tiers.clone();
    let driver =
        tokio::spawn(async move { tiers.rehome(MOVING, "b", Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    driver.abort();
    assert!(driver.await.unwrap_err().is_cancelled());
    // Neither tier grants in the namespace: `a` is fenced, `b` is not its tier yet.
    let s2 = session(&la, 10).await;
    let err = la
        .acquire(&s2, &moving("k2"), Mode::Exclusive, secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::NamespaceFenced { .. }),
        "{err:?}"
    );
    assert!(matches!(
        t.tiers.route(MOVING, "b").await.unwrap_err().kind(),
        ErrorKind::WrongTier { .. }
    ));
    // Another target is refused while this one is under way.
    let err = t
        .tiers
        .rehome(MOVING, "a", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::RehomeInProgress {
            ns: MOVING.into(),
            to: "b".into()
        }
    );
    // The hold ends; the retry resumes and completes.
    held.release().await.unwrap();
    let done = t
        .tiers
        .rehome(MOVING, "b", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(done.from, "a");
    let lb = tier(&t, "b");
    let sb = session(lb, 10).await;
    let h = lb
        .acquire(&sb, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    assert!(token(&h) > before);
    // A retry after the move answers at once, moving nothing.
    let again = t
        .tiers
        .rehome(MOVING, "b", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        (again.from.as_str(), again.epoch.epoch),
        ("b", done.epoch.epoch)
    );
}

#[tokio::test]
async fn etcd_a_class_edit_is_refused_while_a_rehome_fences_the_namespace() {
    let t = two_tiers().await;
    let (la, lb) = (tier(&t, "a").clone(), tier(&t, "b").clone());
    let s = session(&la, 10).await;
    let held = la
        .acquire(&s, &moving("k"), Mode::Exclusive, secs(5))
        .await
        .unwrap();
    // The rehome fences tier a and waits for the hold to end.
    let tiers = t.tiers.clone();
    let rehome =
        tokio::spawn(async move { tiers.rehome(MOVING, "b", Duration::from_secs(10)).await });
    let fence = format!("{ROOT}tier/fence/{MOVING}");
    let deadline = within(Duration::from_secs(5));
    while keys_under(la.client(), &fence).await.is_empty() {
        assert!(Instant::now() < deadline, "the rehome did not fence tier a");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut edited = class(MOVING, "c", "");
    edited.ttl_max = Duration::from_secs(20);
    let err = la.config().put_class(&edited).await.unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::NamespaceFenced { ns: MOVING.into() }
    );
    held.release().await.unwrap();
    rehome.await.unwrap().unwrap();
    // The copy on b is the class as it was; the old tier stays fenced for edits.
    assert_eq!(
        lb.config().class(MOVING, "c").await.unwrap().ttl_max,
        Duration::from_secs(30)
    );
    let err = la.config().put_class(&edited).await.unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::NamespaceFenced { ns: MOVING.into() }
    );
    // On the namespace's tier the edit is taken.
    lb.config().put_class(&edited).await.unwrap();
    assert_eq!(
        lb.config().class(MOVING, "c").await.unwrap().ttl_max,
        Duration::from_secs(20)
    );
}

/// Mirrors `prefix` of cluster `from` into `to` with `etcdctl make-mirror` (which copies
/// keys without their leases) until `to` has `count` keys under it, then stops it.
async fn make_mirror(from: &EtcdCluster, to: &EtcdCluster, prefix: &str, count: usize) {
    let etcdctl = palisade_testkit::EtcdBinaries::get().etcdctl();
    let mut mirror = tokio::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", from.endpoints().join(",")))
        .args(["make-mirror", "--prefix", prefix])
        .arg(to.endpoint(0))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = etcd_client::Client::connect(to.endpoints(), None)
        .await
        .unwrap();
    let deadline = within(Duration::from_secs(10));
    while keys_under(&client, prefix).await.len() < count {
        assert!(
            Instant::now() < deadline,
            "make-mirror did not copy {prefix}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    mirror.kill().await.unwrap();
}

#[tokio::test]
async fn etcd_a_tier_filled_by_make_mirror_is_cleaned_by_the_rehome_and_grants_within_quota() {
    let t = two_tiers().await;
    let (la, lb) = (tier(&t, "a"), tier(&t, "b"));
    let quota = 4;
    let owner = palisade_lock::SpiffeId::new("spiffe://test/owner").unwrap();
    // Three holds of the namespace on tier a, three of its four slots taken.
    let record = la
        .open_detached_session(owner.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    let mut holds = Vec::new();
    for k in ["k0", "k1", "k2"] {
        holds.push(
            la.acquire_in_quota(&record, &moving(k), Mode::Exclusive, secs(5), None, quota)
                .await
                .unwrap(),
        );
    }
    // The operator mirrors the namespace's keys into tier b's cluster.
    let locks = format!("{ROOT}locks/{MOVING}/");
    let slots = format!("{ROOT}quota/{MOVING}/");
    make_mirror(&t.a, &t.b, &locks, 3).await;
    make_mirror(&t.a, &t.b, &slots, 3).await;
    let copies = lb
        .client()
        .clone()
        .get(
            format!("{ROOT}"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let copied: Vec<String> = copies
        .kvs()
        .iter()
        .filter(|kv| {
            kv.key_str().unwrap().starts_with(&locks) || kv.key_str().unwrap().starts_with(&slots)
        })
        .inspect(|kv| assert_eq!(kv.lease(), 0, "make-mirror drops leases"))
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect();
    assert_eq!(copied.len(), 6, "{copied:?}");
    for h in holds {
        h.release().await.unwrap();
    }
    la.revoke_session(record.lease).await.unwrap();

    let done = t
        .tiers
        .rehome(MOVING, "b", Duration::from_secs(10))
        .await
        .unwrap();
    let mut removed: Vec<String> = done.removed.iter().map(|k| k.key.clone()).collect();
    removed.sort();
    let mut expected = copied.clone();
    expected.sort();
    assert_eq!(removed, expected, "the rehome names what it deleted");
    assert!(done.removed.iter().all(|k| k.lease.get() == 0));
    assert!(keys_under(lb.client(), &locks).await.is_empty());
    assert!(keys_under(lb.client(), &slots).await.is_empty());

    // On tier b: all four slots, the three locks the copies named among them, each
    // within a normal wait, in the new epoch.
    let on_b = lb
        .open_detached_session(owner, Duration::from_secs(30))
        .await
        .unwrap();
    for k in ["k0", "k1", "k2", "k3"] {
        let h = lb
            .acquire_in_quota(
                &on_b,
                &moving(k),
                Mode::Exclusive,
                within(Duration::from_secs(2)),
                None,
                quota,
            )
            .await
            .unwrap_or_else(|e| panic!("{k} not granted on the mirrored tier: {e:?}"));
        assert_eq!(token(&h).epoch(), done.epoch.epoch);
        h.forget();
    }
}
