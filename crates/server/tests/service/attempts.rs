//! A 200 means you hold it: an acquire is one attempt (`attempt` in the body), a retry of
//! the attempt gets its hold or its place, another attempt of the same session never
//! ends a hold that was answered (409 `already-held` or `acquire-in-flight`), and only
//! the hold named in `replaces` is ended by an acquire.

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::GetOptions;
use palisade_client::{Client, Mode};
use palisade_testkit::{Loss, LossyProxy};
use serde_json::{json, Value};

use super::{acquire_body, assert_problem, call, fixture, open, slots, Fixture, ADMIN, OWNER};

fn with(mut body: Value, extra: Value) -> Value {
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn release_body(session: &str, key: &str, grant_rev: &Value) -> Value {
    json!({ "session": session, "namespace": "ns", "class": "c", "key": key,
            "mode": "exclusive", "grant_rev": grant_rev })
}

fn token(v: &Value) -> u64 {
    v["token"]
        .as_str()
        .map(|t| t.parse::<u64>().unwrap())
        .or_else(|| v["token"].as_u64())
        .unwrap()
}

/// The lock's keys of one kind (`/h/`, `/q/`) with their create revisions.
async fn lock_keys(f: &Fixture, sub: &str) -> Vec<(String, i64)> {
    let mut c = f.locker.client().clone();
    let resp = c
        .get(
            "/palisade/locks/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        })
        .filter(|(k, _)| k.contains(sub))
        .collect()
}

async fn acquire(addr: SocketAddr, body: Value) -> super::Resp {
    call(addr, "POST", "/v1/locks/acquire", OWNER, body).await
}

/// A second acquire of a held lock by the same session, as another attempt, is refused
/// and ends nothing: the first caller's hold stays, releasable, with its token. The
/// same attempt sent again (a retry after a lost answer) gets that very hold, on either
/// replica, and takes no second quota slot.
#[tokio::test]
async fn etcd_another_attempt_never_ends_a_hold_and_a_retry_gets_the_same_hold() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    let s = open(a, OWNER, 30_000).await;
    let first = acquire(a, with(acquire_body(&s, "k", 1000), json!({"attempt": 11}))).await;
    assert_eq!(first.status, 200, "{:?}", first.body);

    for (addr, attempt) in [(a, 12), (b, 13)] {
        let other = acquire(
            addr,
            with(acquire_body(&s, "k", 1000), json!({"attempt": attempt})),
        )
        .await;
        assert_problem(&other, 409, "already-held");
        let detail = other.body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("grant_rev {}", first.body["grant_rev"])),
            "{detail}"
        );
        // Without an attempt the service picks one: another attempt, refused too.
        let unnamed = acquire(addr, acquire_body(&s, "k", 1000)).await;
        assert_problem(&unnamed, 409, "already-held");
    }
    let holds = lock_keys(&f, "/h/").await;
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(
        holds[0].1,
        first.body["grant_rev"].as_i64().unwrap(),
        "the first grant's hold"
    );
    assert!(lock_keys(&f, "/q/").await.is_empty(), "no waiter left");
    assert_eq!(slots(&f).await, 1, "the refused acquires freed their slots");

    for addr in [a, b] {
        let retry = acquire(
            addr,
            with(acquire_body(&s, "k", 1000), json!({"attempt": 11})),
        )
        .await;
        assert_eq!(retry.status, 200, "{:?}", retry.body);
        assert_eq!(retry.body["grant_rev"], first.body["grant_rev"]);
        assert_eq!(token(&retry.body), token(&first.body));
    }
    assert_eq!(lock_keys(&f, "/h/").await.len(), 1);
    assert_eq!(slots(&f).await, 1, "a retry takes no second slot");
    let r = call(
        b,
        "POST",
        "/v1/locks/release",
        OWNER,
        release_body(&s, "k", &first.body["grant_rev"]),
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(slots(&f).await, 0, "the quota slot went with the hold");
    assert!(lock_keys(&f, "/h/").await.is_empty());
}

/// The leftover of a release whose answer was lost is ended by an acquire that names it
/// in `replaces`, also through the other replica and at the namespace's quota: the new
/// hold has a higher token, the old grant is not held, one slot is taken.
#[tokio::test]
async fn etcd_an_acquire_ends_only_the_hold_it_names_in_replaces() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    let s = open(a, OWNER, 30_000).await;
    for (second, quota) in [(a, None), (b, None), (b, Some(1))] {
        if let Some(q) = quota {
            let r = call(
                a,
                "PUT",
                "/v1/namespaces/ns",
                ADMIN,
                json!({ "tenant_id": "tenant", "held_lease_quota": q }),
            )
            .await;
            assert_eq!(r.status, 200, "{:?}", r.body);
        }
        let first = acquire(a, acquire_body(&s, "k", 1000)).await;
        assert_eq!(first.status, 200, "{:?}", first.body);
        // Naming another grant ends nothing.
        let wrong = acquire(
            second,
            with(
                acquire_body(&s, "k", 1000),
                json!({"replaces": first.body["grant_rev"].as_u64().unwrap() - 1}),
            ),
        )
        .await;
        assert_problem(&wrong, 409, "already-held");
        let again = acquire(
            second,
            with(
                acquire_body(&s, "k", 1000),
                json!({"replaces": first.body["grant_rev"]}),
            ),
        )
        .await;
        assert_eq!(again.status, 200, "quota {quota:?}: {:?}", again.body);
        assert!(token(&again.body) > token(&first.body));
        let holds = lock_keys(&f, "/h/").await;
        assert_eq!(holds.len(), 1, "{holds:?}");
        assert_eq!(holds[0].1, again.body["grant_rev"].as_i64().unwrap());
        assert_eq!(slots(&f).await, 1, "the earlier hold's slot went with it");
        let r = call(
            second,
            "POST",
            "/v1/locks/release",
            OWNER,
            release_body(&s, "k", &first.body["grant_rev"]),
        )
        .await;
        assert_problem(&r, 409, "not-held");
        let r = call(
            second,
            "POST",
            "/v1/locks/release",
            OWNER,
            release_body(&s, "k", &again.body["grant_rev"]),
        )
        .await;
        assert_eq!(r.status, 204, "{:?}", r.body);
        assert_eq!(slots(&f).await, 0);
    }
}

/// Two acquires of one lock on one session at once, 100 times, half of them while
/// another session holds the lock (so both wait): never are both answered 200, and the
/// hold answered stays until its own release.
#[tokio::test]
async fn etcd_concurrent_acquires_on_one_session_never_both_hold() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    let s = open(a, OWNER, 30_000).await;
    let blocker = open(a, OWNER, 30_000).await;
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    for run in 0..100u64 {
        let key = format!("k{run}");
        let contended = run % 2 == 1;
        let held = if contended {
            let r = acquire(a, acquire_body(&blocker, &key, 1000)).await;
            assert_eq!(r.status, 200, "{:?}", r.body);
            Some(r.body)
        } else {
            None
        };
        let one = tokio::spawn(acquire(
            a,
            with(
                acquire_body(&s, &key, 5000),
                json!({"attempt": 2 * run + 1}),
            ),
        ));
        let two = tokio::spawn(acquire(
            b,
            with(
                acquire_body(&s, &key, 5000),
                json!({"attempt": 2 * run + 2}),
            ),
        ));
        if let Some(h) = &held {
            // Let both reach the queue, then let the lock go.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let r = call(
                a,
                "POST",
                "/v1/locks/release",
                OWNER,
                release_body(&blocker, &key, &h["grant_rev"]),
            )
            .await;
            assert_eq!(r.status, 204, "{:?}", r.body);
        }
        let (one, two) = (one.await.unwrap(), two.await.unwrap());
        let answers = [&one, &two];
        let granted: Vec<_> = answers.iter().filter(|r| r.status == 200).collect();
        assert_eq!(
            granted.len(),
            1,
            "run {run}: {:?} / {:?}",
            one.body,
            two.body
        );
        for r in answers.iter().filter(|r| r.status != 200) {
            assert_eq!(r.status, 409, "run {run}: {:?}", r.body);
            let slug = r.body["type"].as_str().unwrap().to_owned();
            assert!(
                slug.ends_with(":already-held") || slug.ends_with(":acquire-in-flight"),
                "run {run}: {slug}"
            );
            *refused.entry(slug).or_default() += 1;
        }
        // The hold answered is there, as answered, until its own release.
        let g = &granted[0].body;
        let holds = lock_keys(&f, &format!("/{key}/h/")).await;
        assert_eq!(holds.len(), 1, "run {run}: {holds:?}");
        assert_eq!(holds[0].1, g["grant_rev"].as_i64().unwrap(), "run {run}");
        let r = call(
            b,
            "POST",
            "/v1/locks/release",
            OWNER,
            release_body(&s, &key, &g["grant_rev"]),
        )
        .await;
        assert_eq!(r.status, 204, "run {run}: {:?}", r.body);
    }
    assert!(
        lock_keys(&f, "/q/").await.is_empty(),
        "no waiter key is left behind"
    );
    // Both refusals happen: a hold found, and a wait found.
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(slots(&f).await, 0);
}

/// The Rust client sends an acquire whose answer was lost again as the same attempt:
/// the grant's answer lost on the way back gets that very hold, never a second one.
#[tokio::test]
async fn etcd_a_client_whose_grant_answer_is_lost_gets_that_hold_on_its_retry() {
    let f = fixture(1).await;
    let direct = f.replicas[0].addr;
    let proxy = LossyProxy::start(direct).await;
    let client = Client::new(format!("http://{}", proxy.addr()))
        .unwrap()
        .with_dev_identity(OWNER);
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    proxy.set(Loss::NextAnswer);
    let hold = session
        .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(proxy.loss(), Loss::None, "the grant's answer was lost once");
    let holds = lock_keys(&f, "/h/").await;
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(
        Some(holds[0].1 as u64),
        hold.grant_rev().map(|r| r.get()),
        "the hold granted to the first request"
    );
    assert_eq!(slots(&f).await, 1);
    hold.release().await.unwrap();
    assert!(lock_keys(&f, "/h/").await.is_empty());
    assert_eq!(slots(&f).await, 0);
}

/// A waiting client whose connection is reset sends its acquire again as the same
/// attempt and keeps its place in the queue: it is granted before a session that
/// queued after it, and the waiter key keeps its create revision.
#[tokio::test]
async fn etcd_a_client_whose_connection_resets_while_waiting_keeps_its_place() {
    let f = fixture(1).await;
    let direct = f.replicas[0].addr;
    let proxy = LossyProxy::start(direct).await;
    let client = Client::new(format!("http://{}", proxy.addr()))
        .unwrap()
        .with_dev_identity(OWNER);
    let blocker = open(direct, OWNER, 30_000).await;
    let held = acquire(direct, acquire_body(&blocker, "k", 1000)).await;
    assert_eq!(held.status, 200, "{:?}", held.body);

    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let waiting = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .acquire("ns", "c", "k", Mode::Exclusive, Duration::from_secs(20))
                .await
        })
    };
    let queued = |n: usize| {
        let f = &f;
        async move {
            let by = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let q = lock_keys(f, "/q/").await;
                if q.len() == n {
                    return q;
                }
                assert!(tokio::time::Instant::now() < by, "{q:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let first = queued(1).await;
    let later_session = open(direct, OWNER, 30_000).await;
    let later = tokio::spawn(acquire(direct, acquire_body(&later_session, "k", 20_000)));
    queued(2).await;

    proxy.reset_open();
    // The retry reaches the service and takes the waiter key over in place.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = queued(2).await;
    let mine = |q: &[(String, i64)]| {
        q.iter()
            .find(|(k, _)| k.ends_with(session.id()))
            .cloned()
            .unwrap()
    };
    assert_eq!(mine(&now), mine(&first), "the same waiter key, same place");
    assert!(!waiting.is_finished());

    let r = call(
        direct,
        "POST",
        "/v1/locks/release",
        OWNER,
        release_body(&blocker, "k", &held.body["grant_rev"]),
    )
    .await;
    assert_eq!(r.status, 204, "{:?}", r.body);
    let hold = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted")
        .unwrap()
        .unwrap();
    assert!(!later.is_finished(), "the session queued later still waits");
    let token_of = |h: &palisade_client::RemoteHold| h.token().unwrap().get();
    let first_token = token_of(&hold);
    hold.release().await.unwrap();
    let later = tokio::time::timeout(Duration::from_secs(10), later)
        .await
        .expect("granted")
        .unwrap();
    assert_eq!(later.status, 200, "{:?}", later.body);
    assert!(token(&later.body) > first_token);
    assert!(lock_keys(&f, "/q/").await.is_empty());
}
