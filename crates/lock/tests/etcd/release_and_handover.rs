//! How holds end and pass on: a release, a force release and an expiry each make their
//! own writes; a contended release (or `release_by` of a forgotten hold) hands the lock
//! to the oldest waiter in the release's own revision.

use std::time::Duration;

use etcd_client::EventType;
use palisade_lock::{Error, ErrorKind, ForceMarker, Hold, Mode, Revision, Session};

use crate::support::{
    base, fixture, hand_over, keys_under, lock, secs, session, spawn_waiter, token, within,
    Fixture, HandedOver, PrefixWatch, ROOT,
};

#[tokio::test]
async fn etcd_grant_release_force_and_expiry_are_told_apart_by_revision() {
    let f = fixture(1).await;
    let name = lock("audit");
    let b = base("audit");
    // The whole root: an expiry also deletes the lease's marker under `leases/`.
    let mut watch = PrefixWatch::start(f.locker.client(), ROOT).await;
    let s = session(&f.locker, 10).await;
    let leases = format!("{ROOT}leases/");
    let (hs, gs) = (
        format!("{b}h/x/{}", s.lease()),
        format!("{b}g/x/{}", s.lease()),
    );

    let h = f
        .locker
        .acquire(&s, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let granted = token(&h).revision().get() as i64;
    h.release().await.unwrap();
    let h = f
        .locker
        .acquire(&s, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let marker = ForceMarker {
        request_id: "fr-1".into(),
        requester: "spiffe://test/admin".into(),
        reason: "stuck".into(),
    };
    let forced = f
        .locker
        .force_release(&name, s.lease(), Mode::Exclusive, &marker)
        .await
        .unwrap();
    assert!(
        h.release().await.unwrap_err().is_not_held(),
        "a force-released hold is not held"
    );
    let e = session(&f.locker, 2).await;
    let he = f
        .locker
        .acquire(&e, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let expiring = format!("{b}h/x/{}", e.lease());
    e.stop_keepalive();
    let events = watch
        .until(|t, k| t == EventType::Delete && k == expiring)
        .await;

    let at = |rev: i64| {
        let mut v: Vec<(EventType, String)> = events
            .iter()
            .filter(|x| x.2 == rev && (x.1.starts_with(&b) || x.1.starts_with(&leases)))
            .map(|x| (x.0, x.1.clone()))
            .collect();
        v.sort_by(|a, b| a.1.cmp(&b.1));
        v
    };
    use EventType::{Delete, Put};
    // Class `c` has no lock-delay: its grants write no grant record.
    assert_eq!(
        at(granted),
        vec![(Put, hs.clone())],
        "grant: the hold created"
    );
    let released = events
        .iter()
        .find(|x| x.0 == Delete && x.1 == hs)
        .unwrap()
        .2;
    assert_eq!(
        at(released),
        vec![(Delete, hs.clone())],
        "release: the hold deleted, the lease's marker kept"
    );
    let force_events = at(forced.get() as i64);
    assert_eq!(
        force_events,
        vec![(Put, gs.clone()), (Delete, hs.clone())],
        "force: hold deleted, grant record marked"
    );
    let marked = events
        .iter()
        .find(|x| x.2 == forced.get() as i64 && x.1 == gs)
        .unwrap();
    assert!(
        marked.3.contains("\"forced\"") && marked.3.contains("fr-1"),
        "{}",
        marked.3
    );
    let expired = events.last().unwrap().2;
    assert_eq!(
        at(expired),
        vec![
            (Delete, format!("{leases}{}", e.lease())),
            (Delete, expiring.clone())
        ],
        "expiry: the hold deleted with its lease's marker"
    );
    // The grant after the force consumed the forced grant record in its own revision.
    let regranted = token(&he).revision().get() as i64;
    assert!(at(regranted).contains(&(Delete, gs.clone())));
}

#[tokio::test]
async fn etcd_a_contended_release_hands_the_lock_to_the_oldest_waiter_in_its_own_revision() {
    let f = fixture(1).await;
    let name = lock("handover");
    let HandedOver {
        c,
        hc,
        tb,
        released_at,
    } = hand_over(&f.locker, &name, &base("handover")).await;
    assert_eq!(
        hc.grant_rev().unwrap().as_i64(),
        released_at,
        "C's grant is B's release revision"
    );
    assert_eq!(token(&hc).revision().as_i64(), released_at);
    assert!(token(&hc) > tb);
    // C's waiter key went in that revision; its hold is the one key left (class `c`
    // has no lock-delay, so no grant record).
    let under = keys_under(f.locker.client(), &base("handover")).await;
    let lease = c.lease().to_string();
    assert_eq!(under, [format!("{}h/x/{lease}", base("handover"))]);
    hc.release().await.unwrap();
    assert_eq!(
        keys_under(f.locker.client(), &base("handover")).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn etcd_a_release_whose_next_waiter_gave_up_hands_over_to_nobody() {
    let f = fixture(1).await;
    let name = lock("handover-gone");
    let s: Vec<Session> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(session(&f.locker, 10).await);
        }
        v
    };
    let ha = f
        .locker
        .acquire(&s[0], &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let wb = spawn_waiter(&f.locker, &s[1], &name, Mode::Exclusive, secs(30)).await;
    let wc = spawn_waiter(&f.locker, &s[2], &name, Mode::Exclusive, secs(30)).await;
    let wd = spawn_waiter(&f.locker, &s[3], &name, Mode::Exclusive, secs(30)).await;
    ha.release().await.unwrap();
    let hb = wb.await.unwrap().unwrap();
    // C, whom B's release would hand over to, gives up.
    let mut queue =
        PrefixWatch::start(f.locker.client(), &format!("{}q/", base("handover-gone"))).await;
    wc.abort();
    let (gone, _) = queue.next(EventType::Delete).await;
    assert!(gone.ends_with(&s[2].lease().to_string()), "{gone}");
    let mut holds =
        PrefixWatch::start(f.locker.client(), &format!("{}h/", base("handover-gone"))).await;
    hb.release().await.unwrap();
    let (_, released_at) = holds.next(EventType::Delete).await;
    let hd = tokio::time::timeout(Duration::from_secs(5), wd)
        .await
        .expect("D granted after B's release")
        .unwrap()
        .unwrap();
    // No hold for C; D granted itself in a later write.
    assert!(hd.grant_rev().unwrap().as_i64() > released_at);
    let under = keys_under(f.locker.client(), &base("handover-gone")).await;
    let c = s[2].lease().to_string();
    assert!(!under.iter().any(|k| k.ends_with(&c)), "{under:?}");
    hd.release().await.unwrap();
}

/// The start of the `release_by` hand-over tests: A holds `key`, B and C queue behind
/// it, A's release hands the lock to B, and B's hold is forgotten as the service does
/// (only its lease and grant revision stay). Returns the three sessions (for the caller
/// to keep), C's waiter and B's grant revision.
async fn handed_to_b_and_forgotten(
    f: &Fixture,
    key: &str,
    ttl_secs: u64,
    wait: Duration,
) -> (
    [Session; 3],
    tokio::task::JoinHandle<Result<Hold, Error>>,
    Revision,
) {
    let name = lock(key);
    let (a, b, c) = (
        session(&f.locker, ttl_secs).await,
        session(&f.locker, ttl_secs).await,
        session(&f.locker, ttl_secs).await,
    );
    let ha = f
        .locker
        .acquire(&a, &name, Mode::Exclusive, secs(5))
        .await
        .unwrap();
    let wb = spawn_waiter(&f.locker, &b, &name, Mode::Exclusive, within(wait)).await;
    let wc = spawn_waiter(&f.locker, &c, &name, Mode::Exclusive, within(wait)).await;
    ha.release().await.unwrap();
    let hb = wb.await.unwrap().unwrap();
    let grant_rev = hb.grant_rev().unwrap();
    hb.forget();
    ([a, b, c], wc, grant_rev)
}

/// `release_by` of B's forgotten grant (see [`handed_to_b_and_forgotten`]) hands over:
/// B's hold key is deleted, and C is granted in that same revision. Returns C's hold.
async fn release_by_hands_over_to_c(
    f: &Fixture,
    key: &str,
    b: &Session,
    grant_rev: Revision,
    wc: tokio::task::JoinHandle<Result<Hold, Error>>,
) -> Hold {
    let mut holds = PrefixWatch::start(f.locker.client(), &format!("{}h/", base(key))).await;
    f.locker
        .release_by(&lock(key), b.lease(), Mode::Exclusive, grant_rev)
        .await
        .unwrap();
    let (gone, released_at) = holds.next(EventType::Delete).await;
    assert!(gone.ends_with(&b.lease().to_string()), "{gone}");
    let hc = tokio::time::timeout(Duration::from_secs(10), wc)
        .await
        .expect("C granted after B's release")
        .unwrap()
        .unwrap();
    assert_eq!(
        hc.grant_rev().unwrap().as_i64(),
        released_at,
        "C's grant is B's release revision"
    );
    hc
}

#[tokio::test]
async fn etcd_release_by_of_a_forgotten_hold_hands_over_as_its_release_would() {
    let f = fixture(1).await;
    let ([_a, b, _c], wc, grant_rev) =
        handed_to_b_and_forgotten(&f, "handover-by", 10, Duration::from_secs(30)).await;
    let hc = release_by_hands_over_to_c(&f, "handover-by", &b, grant_rev, wc).await;
    // A second release_by of the same grant finds nothing (and hands over nothing).
    let again = f
        .locker
        .release_by(&lock("handover-by"), b.lease(), Mode::Exclusive, grant_rev)
        .await
        .unwrap_err();
    assert_eq!(*again.kind(), ErrorKind::NotHeld);
    hc.release().await.unwrap();
}

#[tokio::test]
async fn etcd_release_by_that_could_not_commit_still_hands_over_when_retried() {
    let mut f = fixture(1).await;
    let ([_a, b, _c], wc, grant_rev) =
        handed_to_b_and_forgotten(&f, "handover-retry", 20, Duration::from_secs(60)).await;
    // etcd is down: the release cannot commit.
    f.cluster.stop(0).await;
    let err = f
        .locker
        .release_by(
            &lock("handover-retry"),
            b.lease(),
            Mode::Exclusive,
            grant_rev,
        )
        .await
        .unwrap_err();
    assert!(err.is_quorum_lost(), "{err:?}");
    f.cluster.restart(0).await;
    // The retry hands over as the first attempt would have.
    let hc = release_by_hands_over_to_c(&f, "handover-retry", &b, grant_rev, wc).await;
    hc.release().await.unwrap();
}
