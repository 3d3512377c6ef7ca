//! `MysqlStore` behind the `FenceLayer` over real HTTP on loopback: 409 for a stale token,
//! 503 when the database cannot be reached, and never an admit then.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::put;
use axum::Router;
use http::{Method, StatusCode};
use palisade_fence::{
    ChannelObserver, Enforcement, EnforcementTable, FenceLayer, HighWaterStore, MysqlStore, Raise,
    WriteOutcome,
};

use crate::common::{client, send, serve, tok};
use crate::mysql_helper::fresh_mysql;

fn counting_app(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/{*path}",
        put(move || {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                "written"
            }
        }),
    )
}

#[tokio::test]
async fn mysql_store_behind_the_layer_admits_equal_and_newer_and_answers_409_for_stale() {
    let (db, _conn) = fresh_mysql().await;
    let store = MysqlStore::new(db.pool());
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting_app(Arc::clone(&calls)).layer(FenceLayer::new(store.clone()))).await;
    let c = client();
    for (token, status) in [
        (10, 200),
        (10, 200),
        (12, 200),
        (11, 409),
        (3, 409),
        (12, 200),
    ] {
        let r = send(
            &c,
            Method::PUT,
            addr,
            "/orders/1",
            &[&tok(token).to_string()],
        )
        .await;
        assert_eq!(r.status.as_u16(), status, "token {token}");
        if status == 409 {
            let doc = r.json();
            assert_eq!(doc["type"], "urn:palisade:problem:stale-token", "{doc}");
            assert_eq!(doc["highest"], tok(12).to_string(), "{doc}");
            assert_eq!(doc["token"], tok(token).to_string(), "{doc}");
        }
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the stale writes never reached the handler"
    );
    let r = send(&c, Method::PUT, addr, "/orders/2", &[&tok(1).to_string()]).await;
    assert_eq!(r.status, StatusCode::OK, "marks are per resource");
    assert_eq!(
        store.mark("/orders/1").await.unwrap().unwrap().token,
        tok(12)
    );
    assert_eq!(
        store.mark("/orders/2").await.unwrap().unwrap().token,
        tok(1)
    );
    assert_eq!(store.mark("/orders/3").await.unwrap(), None);
}

/// Many concurrent raises of one resource through the store: the final mark is the
/// highest token, and no admitted raise was below the mark a raise that completed before
/// it started had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_store_concurrent_raises_leave_the_maximum_and_never_admit_below_a_completed_one() {
    let (db, _conn) = fresh_mysql().await;
    let store = MysqlStore::new(db.pool());
    let floor = Arc::new(std::sync::Mutex::new(0_u64));
    let mut tasks = Vec::new();
    for i in 0..16_u64 {
        let (store, floor) = (store.clone(), Arc::clone(&floor));
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for j in 0..20_u64 {
                let token = tok((i * 7919 + j * 104_729) % 997 + 1);
                let before = *floor.lock().unwrap();
                match store.raise_async("hot", token).await.unwrap() {
                    Raise::Admitted => {
                        assert!(token.get() >= before, "{token} admitted below {before}");
                        admitted += 1;
                        let mut f = floor.lock().unwrap();
                        *f = (*f).max(token.get());
                    }
                    Raise::Stale { highest } => {
                        assert!(highest > token, "{token} refused by {highest}");
                        let mut f = floor.lock().unwrap();
                        *f = (*f).max(highest.get());
                    }
                }
            }
            admitted
        }));
    }
    let mut max_seen = 0;
    for t in tasks {
        max_seen += t.await.unwrap();
    }
    assert!(max_seen > 0);
    let max = (0..16_u64)
        .flat_map(|i| (0..20_u64).map(move |j| (i * 7919 + j * 104_729) % 997 + 1))
        .max()
        .unwrap();
    assert_eq!(store.mark("hot").await.unwrap().unwrap().token, tok(max));
}

#[tokio::test]
async fn mysql_store_down_is_a_retryable_error_and_a_503_never_an_admit() {
    // A port nothing listens on: bound, then released.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let store = MysqlStore::from_url(&format!("mysql://root@127.0.0.1:{port}/nothing"))
        .unwrap()
        .with_timeout(Duration::from_secs(3));
    let e = store.raise("/x", tok(3)).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let e = store.mark("/x").await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");

    let calls = Arc::new(AtomicUsize::new(0));
    let (observer, mut events) = ChannelObserver::bounded(8);
    let layer = FenceLayer::new(store)
        .with_enforcement_table(
            EnforcementTable::new(Enforcement::Fenced).with_prefix("/adv/", Enforcement::Advisory),
        )
        .with_observer(observer);
    let addr = serve(counting_app(Arc::clone(&calls)).layer(layer)).await;
    let c = client();
    let r = send(&c, Method::PUT, addr, "/x", &[&tok(3).to_string()]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let doc = r.json();
    assert_eq!(
        doc["type"], "urn:palisade:problem:store-unavailable",
        "{doc}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a fenced write never passes a down store"
    );
    let r = send(&c, Method::PUT, addr, "/adv/x", &[&tok(3).to_string()]).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "advisory resources pass, reported"
    );
    let e = events.try_recv().unwrap();
    assert_eq!(
        (e.outcome, e.unprotected),
        (WriteOutcome::StoreUnavailable, true)
    );
}

/// A database that goes away under a working store: the store's account is dropped
/// (every new connection refused) and its sessions killed. The raise fails, the layer
/// answers 503.
#[tokio::test]
async fn mysql_store_losing_its_database_mid_run_answers_503() {
    let (db, mut admin) = fresh_mysql().await;
    let user = db
        .create_user(&["GRANT EXECUTE ON PROCEDURE {db}.fence_raise TO {user}"])
        .await;
    let store = MysqlStore::from_url(&user.url).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting_app(Arc::clone(&calls)).layer(FenceLayer::new(store))).await;
    let c = client();
    let r = send(&c, Method::PUT, addr, "/y", &[&tok(5).to_string()]).await;
    assert_eq!(r.status, StatusCode::OK);
    use mysql_async::prelude::Queryable;
    admin
        .query_drop(format!("DROP USER '{}'@'%'", user.name))
        .await
        .unwrap();
    let ids: Vec<u64> = admin
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?",
            (user.name.as_str(),),
        )
        .await
        .unwrap();
    for id in ids {
        admin.query_drop(format!("KILL {id}")).await.unwrap();
    }
    let r = send(&c, Method::PUT, addr, "/y", &[&tok(6).to_string()]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// On connections with `autocommit=0` (set by the pool's init statements here; the
/// server's `autocommit` setting does the same) each raise is still a transaction of its
/// own: the mark is committed at once and no row lock outlives the raise, admitted or
/// refused.
#[tokio::test]
async fn mysql_store_on_connections_with_autocommit_off_commits_each_raise() {
    use mysql_async::prelude::Queryable;
    use mysql_async::{OptsBuilder, Pool};
    use palisade_fence::mysql::read_mark;
    let (db, mut conn) = fresh_mysql().await;
    let opts = OptsBuilder::from_opts(db.opts()).init(vec!["SET autocommit = 0"]);
    let store = MysqlStore::new(Pool::new(opts));
    conn.query_drop("SET SESSION innodb_lock_wait_timeout = 2")
        .await
        .unwrap();
    assert_eq!(
        store.raise_async("s", tok(5)).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        read_mark(&mut conn, "s").await.unwrap().unwrap().token,
        tok(5),
        "committed"
    );
    assert_eq!(
        store.raise_async("s", tok(4)).await.unwrap(),
        Raise::Stale { highest: tok(5) }
    );
    // No lock is left behind: another session raises at once (no lock wait timeout).
    conn.exec_drop("CALL fence_raise(?, ?)", ("s", tok(6).get()))
        .await
        .unwrap();
    assert_eq!(
        store.raise_async("s", tok(7)).await.unwrap(),
        Raise::Admitted
    );
    conn.exec_drop("CALL fence_raise(?, ?)", ("s", tok(8).get()))
        .await
        .unwrap();
    store.pool().clone().disconnect().await.unwrap();
}
