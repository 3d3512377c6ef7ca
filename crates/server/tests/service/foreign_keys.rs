//! `GET /v1/locks/status` lists keys under a lock that no live session owns (a copy of a
//! hold without its lease, as `etcdctl make-mirror` writes one) as `foreign_keys` with
//! their lease, never as holders; the next acquire is granted past it.

use serde_json::{json, Value};

use super::{acquire_body, call, fixture, open, OWNER};

#[tokio::test]
async fn etcd_status_lists_a_leaseless_hold_as_foreign_and_an_acquire_gets_past_it() {
    let f = fixture(1).await;
    let addr = f.replicas[0].addr;
    let key = "/palisade/locks/ns/c/k/h/x/00000000000000aa";
    let meta = json!({ "spiffe_id": OWNER, "class": "c", "mode": "exclusive",
                       "epoch": 0, "attempt": 1 });
    f.locker
        .client()
        .clone()
        .put(key, meta.to_string(), None)
        .await
        .unwrap();
    let status = || async {
        call(
            addr,
            "GET",
            "/v1/locks/status?namespace=ns&class=c&key=k",
            OWNER,
            Value::Null,
        )
        .await
    };
    let st = status().await;
    assert_eq!(st.status, 200, "{:?}", st.body);
    assert_eq!(st.body["holders"], json!([]), "{:?}", st.body);
    assert_eq!(st.body["waiters"], json!([]), "{:?}", st.body);
    assert_eq!(
        st.body["foreign_keys"],
        json!([{ "key": key, "lease": "0000000000000000" }])
    );
    let session = open(addr, OWNER, 10_000).await;
    let r = call(
        addr,
        "POST",
        "/v1/locks/acquire",
        OWNER,
        acquire_body(&session, "k", 2_000),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let st = status().await;
    assert_eq!(st.body["foreign_keys"], json!([]), "{:?}", st.body);
    assert_eq!(st.body["holders"][0]["session"], session.as_str());
}
