//! `held_lease_quota` counts sessions opened with a namespace, and an expired session
//! frees its slot within one TTL.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{acquire_body, assert_problem, call, fixture, keys, ADMIN, OTHER, OWNER, STRANGER};

#[tokio::test]
async fn etcd_sessions_opened_with_a_namespace_count_against_its_quota_until_they_expire() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    let r = call(
        a,
        "PUT",
        "/v1/namespaces/ns",
        ADMIN,
        json!({ "tenant_id": "tenant", "held_lease_quota": 2 }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // Session A (2 s, the etcd minimum) counts; so does its hold: the quota is full.
    let opened_a = Instant::now();
    let r = call(
        a,
        "POST",
        "/v1/sessions",
        OWNER,
        json!({ "ttl_ms": 2000, "namespace": "ns" }),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["namespace"], "ns");
    let sa = r.body["session"].as_str().unwrap().to_owned();
    let h = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&sa, "k", 1_000),
    )
    .await;
    assert_eq!(h.status, 200, "{:?}", h.body);

    // Through the other replica: a third session of the namespace is refused, and
    // nothing of it stays in etcd.
    let before = keys(&f).await;
    let r = call(
        b,
        "POST",
        "/v1/sessions",
        OTHER,
        json!({ "ttl_ms": 10000, "namespace": "ns" }),
    )
    .await;
    assert_problem(&r, 429, "quota-exceeded");
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap()
            .contains("held_lease_quota"),
        "{:?}",
        r.body
    );
    assert_eq!(keys(&f).await, before, "the refused session left nothing");
    // A session without a namespace does not count; one for a namespace the caller has
    // no grant in, or that does not exist, is refused before anything is written.
    let r = call(b, "POST", "/v1/sessions", OTHER, json!({ "ttl_ms": 10000 })).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r.body["namespace"].is_null());
    let before = keys(&f).await;
    let r = call(
        b,
        "POST",
        "/v1/sessions",
        STRANGER,
        json!({ "ttl_ms": 10000, "namespace": "ns" }),
    )
    .await;
    assert_problem(&r, 403, "forbidden");
    let r = call(
        b,
        "POST",
        "/v1/sessions",
        ADMIN,
        json!({ "ttl_ms": 10000, "namespace": "nope" }),
    )
    .await;
    assert_problem(&r, 404, "not-found");
    let r = call(
        b,
        "POST",
        "/v1/sessions",
        OWNER,
        json!({ "ttl_ms": 10000, "namespace": "Bad" }),
    )
    .await;
    assert_problem(&r, 400, "invalid-input");
    assert_eq!(keys(&f).await, before);

    // Session A is never kept alive: once its lease expires, its slot and its hold's
    // slot are free, within one TTL of its last renewal (plus etcd's expiry check).
    let limit = Duration::from_millis(2000 + 1500);
    loop {
        let r = call(
            b,
            "POST",
            "/v1/sessions",
            OTHER,
            json!({ "ttl_ms": 10000, "namespace": "ns" }),
        )
        .await;
        if r.status == 201 {
            break;
        }
        assert_problem(&r, 429, "quota-exceeded");
        assert!(
            opened_a.elapsed() < limit,
            "slot not freed after {:?}",
            opened_a.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "slot free {:?} after the session opened",
        opened_a.elapsed()
    );
    // Both of A's slots went: a second namespace session fits too, a third does not.
    let r = call(
        a,
        "POST",
        "/v1/sessions",
        OTHER,
        json!({ "ttl_ms": 10000, "namespace": "ns" }),
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = call(
        a,
        "POST",
        "/v1/sessions",
        OTHER,
        json!({ "ttl_ms": 10000, "namespace": "ns" }),
    )
    .await;
    assert_problem(&r, 429, "quota-exceeded");
}
