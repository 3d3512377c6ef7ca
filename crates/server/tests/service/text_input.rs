//! Free text in requests (a force release's reason and request id, a namespace's tenant
//! and tier): a NUL or another control character, blank or too long is 400
//! `invalid-input` naming the field and the cause, and nothing reaches etcd or the force
//! release table.

use std::sync::Arc;

use palisade_server::{Authz, AuthzConfig, ForceReleases, ServiceOptions};
use palisade_testkit::TestDb;
use serde_json::{json, Value};

use super::{
    acquire_body, assert_problem, call, fixture, keys, open, pool_of, start_replica, Recorded,
    ADMIN, ADMIN2, AUTHZ, OWNER,
};

/// Rows of the force release request table.
async fn requests(pg: &tokio_postgres::Client) -> i64 {
    pg.query_one("SELECT count(*) FROM force_release_request", &[])
        .await
        .unwrap()
        .get(0)
}

fn detail(r: &super::Resp) -> String {
    r.body["detail"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn etcd_bad_text_is_400_naming_the_field_before_etcd_or_postgres() {
    let f = fixture(0).await;
    let db = TestDb::create().await;
    let pg = db.connect().await;
    let force = ForceReleases::new(pool_of(&db), Arc::new(Recorded::default()));
    force.migrate().await.unwrap();
    let authz = format!(
        "admins = [\"{ADMIN}\", \"{ADMIN2}\"]\n{}",
        AUTHZ.replace("admins = [\"spiffe://test/ops\"]", "")
    );
    let options = ServiceOptions::new(Authz::fixed(AuthzConfig::from_toml(&authz).unwrap()))
        .insecure_dev_identity()
        .with_force_releases(force);
    let addr = start_replica(f.connect().await.unwrap(), options)
        .await
        .addr;
    // A holder of `k`, so that a request with good text names a hold.
    let s = open(addr, OWNER, 30_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s, "k", 1000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let before = keys(&f).await;

    // The reason of a force release request.
    let long = "x".repeat(1025);
    for (reason, cause) in [
        ("stuck\0job", "control character U+0000 at byte 5"),
        ("\u{1b}[31mred", "control character U+001B at byte 0"),
        ("two\nlines", "control character U+000A at byte 3"),
        ("c1 \u{85}", "control character U+0085 at byte 3"),
        (" \u{a0}", "blank"),
        ("", "empty"),
        (long.as_str(), "1025 bytes, more than 1024"),
    ] {
        let body = json!({ "namespace": "ns", "class": "c", "key": "k", "reason": reason });
        let r = call(addr, "POST", "/v1/force-releases", ADMIN, body).await;
        assert_problem(&r, 400, "invalid-input");
        let d = detail(&r);
        assert!(d.contains("reason") && d.contains(cause), "{reason:?}: {d}");
    }
    assert_eq!(requests(&pg).await, 0, "a refused request was stored");

    // The request id of an approval (a path segment, percent-decoded).
    let long_id = "a".repeat(65);
    for (id, cause) in [
        ("a%00b", "control character U+0000 at byte 1"),
        ("%1B", "control character U+001B at byte 0"),
        (long_id.as_str(), "65 bytes, more than 64"),
    ] {
        let path = format!("/v1/force-releases/{id}/approve");
        let r = call(addr, "POST", &path, ADMIN2, Value::Null).await;
        assert_problem(&r, 400, "invalid-input");
        let d = detail(&r);
        assert!(d.contains("id ") && d.contains(cause), "{id:?}: {d}");
    }

    // A namespace's tenant and tier.
    for (body, field, cause) in [
        (
            json!({ "tenant_id": "ac\0me" }),
            "tenant_id",
            "U+0000 at byte 2",
        ),
        (json!({ "tenant_id": "" }), "tenant_id", "empty"),
        (
            json!({ "tenant_id": "acme", "cluster_tier": "gold\r" }),
            "cluster_tier",
            "U+000D at byte 4",
        ),
        (
            json!({ "tenant_id": "acme", "cluster_tier": "t".repeat(257) }),
            "cluster_tier",
            "257 bytes, more than 256",
        ),
    ] {
        let r = call(addr, "PUT", "/v1/namespaces/ns2", ADMIN, body.clone()).await;
        assert_problem(&r, 400, "invalid-input");
        let d = detail(&r);
        assert!(d.contains(field) && d.contains(cause), "{body}: {d}");
    }
    assert_eq!(keys(&f).await, before, "bad text wrote to etcd");

    // Good text passes the same checks: non-ASCII, inner spaces, at the bounds.
    let reason = format!("stuck batch job, see ticket ü {}", "x".repeat(993));
    assert_eq!(reason.len(), 1024);
    let body = json!({ "namespace": "ns", "class": "c", "key": "k", "reason": reason });
    let r = call(addr, "POST", "/v1/force-releases", ADMIN, body).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body["reason"], reason.as_str());
    assert_eq!(requests(&pg).await, 1);
    let r = call(
        addr,
        "PUT",
        "/v1/namespaces/ns2",
        ADMIN,
        json!({ "tenant_id": "Acme Corp. (EU)", "cluster_tier": "t".repeat(256) }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["tenant_id"], "Acme Corp. (EU)");
}
