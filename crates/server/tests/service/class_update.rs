//! A class update through one replica reaches the others: each locker's class cache
//! follows a watch on the config prefix.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::{acquire_body, call, fixture, open, ADMIN, OTHER, OWNER};

/// Bound on how long a class update may take to reach another replica.
const BOUND: Duration = Duration::from_secs(3);

/// Acquires `key` on `addr` with a fresh session until `accepted(status)` holds; the
/// time it took.
async fn until(addr: std::net::SocketAddr, key: &str, accepted: impl Fn(u16) -> bool) -> Duration {
    let started = Instant::now();
    let mut n = 0;
    loop {
        let s = open(addr, OTHER, 5_000).await;
        let r = call(
            addr,
            "POST",
            "/v1/locks/acquire",
            OTHER,
            acquire_body(&s, &format!("{key}-{n}"), 200),
        )
        .await;
        let _ = call(
            addr,
            "DELETE",
            &format!("/v1/sessions/{s}"),
            OTHER,
            Value::Null,
        )
        .await;
        if accepted(r.status) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < BOUND,
            "not enforced within {BOUND:?}: {} {:?}",
            r.status,
            r.body
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn etcd_class_update_through_one_replica_is_enforced_by_the_other_within_a_bound() {
    let mut f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);

    // Replica B uses class c (prefix ""): its cache holds it.
    let s = open(b, OWNER, 10_000).await;
    let r = call(
        b,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // Replica A narrows the class to keys under "p/".
    let put = |prefix: &'static str| async move {
        let r = call(
            a,
            "PUT",
            "/v1/namespaces/ns/classes/c",
            ADMIN,
            json!({ "key_prefix": prefix, "ttl_max_ms": 30_000 }),
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    };
    put("p/").await;
    // B refuses keys outside the new prefix (400 invalid-input), within the bound.
    let took = until(b, "k", |s| s == 400).await;
    eprintln!("prefix p/ enforced by the other replica after {took:?}");
    let s2 = open(b, OWNER, 10_000).await;
    let r = call(
        b,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s2, "p/ok", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // After etcd restarts (B's watch breaks and is re-established), updates still reach B.
    f.cluster.kill(0);
    f.cluster.restart(0).await;
    put("").await;
    let took = until(b, "k", |s| s == 200).await;
    eprintln!("prefix \"\" enforced by the other replica after {took:?}");
    // Give B's watch time to be back, then update again: served from a live cache.
    tokio::time::sleep(Duration::from_secs(3)).await;
    put("q/").await;
    let took = until(b, "k", |s| s == 400).await;
    eprintln!("prefix q/ enforced by the other replica after {took:?}");
}
