//! `holder_meta` on acquire: stored with the hold (and the waiter), listed by status,
//! bounded in size.

use std::time::Duration;

use palisade_client::Client;
use palisade_lock::{HolderMeta, Mode, MAX_HOLDER_META_LEN};
use serde_json::json;

use super::{acquire_body, assert_problem, call, fixture, keys, open, OTHER, OWNER};

#[tokio::test]
async fn etcd_holder_meta_is_stored_with_the_hold_listed_by_status_and_bounded() {
    let f = fixture(2).await;
    let (a, b) = (f.replicas[0].addr, f.replicas[1].addr);
    let s1 = open(a, OWNER, 10_000).await;
    let s2 = open(b, OTHER, 10_000).await;

    // The holder attaches meta through replica A.
    let mut body = acquire_body(&s1, "k", 1_000);
    body["holder_meta"] = json!({ "host": "worker-1", "pid": 4242, "job": { "id": "j-7" } });
    let r = call(a, "POST", "/v1/locks/acquire", OWNER, body).await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    // A waiter with other meta (through replica B), and one without, queue behind it.
    let mut wait = acquire_body(&s2, "k", 3_000);
    wait["holder_meta"] = json!({ "host": "worker-2" });
    let waiter =
        tokio::spawn(async move { call(b, "POST", "/v1/locks/acquire", OTHER, wait).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Status through the other replica lists each holder's and waiter's meta.
    let path = "/v1/locks/status?namespace=ns&class=c&key=k";
    let st = call(b, "GET", path, OWNER, serde_json::Value::Null).await;
    assert_eq!(st.status, 200, "{:?}", st.body);
    assert_eq!(st.body["holders"].as_array().unwrap().len(), 1);
    assert_eq!(st.body["holders"][0]["session"], s1.as_str());
    assert_eq!(
        st.body["holders"][0]["holder_meta"],
        json!({ "host": "worker-1", "pid": 4242, "job": { "id": "j-7" } })
    );
    assert_eq!(st.body["waiters"][0]["session"], s2.as_str());
    assert_eq!(
        st.body["waiters"][0]["holder_meta"],
        json!({ "host": "worker-2" })
    );

    // Granted after the release: the waiter's meta goes with its hold.
    let grant_rev = r.body["grant_rev"].clone();
    let rel = json!({ "session": s1, "namespace": "ns", "class": "c", "key": "k",
                      "mode": "exclusive", "grant_rev": grant_rev });
    assert_eq!(
        call(a, "POST", "/v1/locks/release", OWNER, rel)
            .await
            .status,
        204
    );
    let w = waiter.await.unwrap();
    assert_eq!(w.status, 200, "{:?}", w.body);
    let st = call(a, "GET", path, OWNER, serde_json::Value::Null).await;
    assert_eq!(st.body["holders"][0]["session"], s2.as_str());
    assert_eq!(
        st.body["holders"][0]["holder_meta"],
        json!({ "host": "worker-2" })
    );

    // A hold without meta lists null.
    let r = call(
        a,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&s1, "plain", 1_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let st = call(
        a,
        "GET",
        "/v1/locks/status?namespace=ns&class=c&key=plain",
        OWNER,
        serde_json::Value::Null,
    )
    .await;
    assert!(
        st.body["holders"][0]["holder_meta"].is_null(),
        "{:?}",
        st.body
    );

    // Over the limit, or not an object: 4xx problem, nothing written.
    let before = keys(&f).await;
    let mut big = acquire_body(&s1, "big", 1_000);
    big["holder_meta"] = json!({ "k": "x".repeat(MAX_HOLDER_META_LEN - 7) });
    let r = call(a, "POST", "/v1/locks/acquire", OWNER, big).await;
    assert_problem(&r, 400, "invalid-input");
    assert!(
        r.body["detail"].as_str().unwrap().contains("holder_meta"),
        "{:?}",
        r.body
    );
    for not_object in [json!([1, 2]), json!("host"), json!(7)] {
        let mut b = acquire_body(&s1, "big", 1_000);
        b["holder_meta"] = not_object;
        let r = call(a, "POST", "/v1/locks/acquire", OWNER, b).await;
        assert_problem(&r, 422, "invalid-input");
    }
    assert_eq!(keys(&f).await, before, "refused acquires wrote nothing");
    // Exactly at the limit is accepted.
    let mut at = acquire_body(&s1, "big", 1_000);
    at["holder_meta"] = json!({ "k": "x".repeat(MAX_HOLDER_META_LEN - 8) });
    assert_eq!(
        call(a, "POST", "/v1/locks/acquire", OWNER, at).await.status,
        200
    );

    // The Rust client sends it too.
    let client = Client::new(format!("http://{a}"))
        .unwrap()
        .with_dev_identity(OWNER);
    let session = client.open_session(Duration::from_secs(5)).await.unwrap();
    let meta = HolderMeta::from_value(json!({ "via": "client" })).unwrap();
    let hold = session
        .acquire_with_meta(
            "ns",
            "c",
            "from-client",
            Mode::Exclusive,
            Duration::from_secs(1),
            Some(&meta),
        )
        .await
        .unwrap();
    let st = call(
        a,
        "GET",
        "/v1/locks/status?namespace=ns&class=c&key=from-client",
        OWNER,
        serde_json::Value::Null,
    )
    .await;
    assert_eq!(st.body["holders"][0]["session"], session.id());
    assert_eq!(
        st.body["holders"][0]["holder_meta"],
        json!({ "via": "client" })
    );
    hold.release().await.unwrap();
    session.close().await.unwrap();
}
