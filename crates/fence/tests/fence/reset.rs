//! Reading a mark and lowering a poisoned one: needs a reason, only lowers, leaves a log
//! row, waits for fenced writers in flight, and keeps older holders refused.

use std::sync::Arc;
use std::time::Duration;

use palisade_fence::postgres::read_resets;
use palisade_fence::{
    begin_fenced, read_mark, reset_mark, Epoch, FenceErrorKind, FencingToken, HighWaterStore,
    PostgresStore, Raise, Revision,
};

use crate::common::tok;
use crate::postgres_helper::fresh_db;

/// An epoch-1 token on an epoch-0 system poisons the mark; the reset to the current
/// holder's token mends it: the holder writes again, every older one stays refused.
#[tokio::test]
async fn a_poisoned_mark_is_shown_and_reset_to_the_holders_token_with_a_logged_reason() {
    let (db, client) = fresh_db().await;
    let store = PostgresStore::new(Arc::new(db.connect().await)).with_reject_cache(16);
    let e0 = |rev| FencingToken::from_parts(Epoch::new(0).unwrap(), Revision::new(rev)).unwrap();
    assert_eq!(
        store.raise("orders/1", e0(100)).await.unwrap(),
        Raise::Admitted
    );
    // The mistaken write: an example's epoch-1 token.
    let poison = tok(7);
    assert_eq!(
        store.raise("orders/1", poison).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        store.raise("orders/1", e0(120)).await.unwrap(),
        Raise::Stale { highest: poison },
        "every real token is refused"
    );
    let shown = store.mark("orders/1").await.unwrap().unwrap();
    assert_eq!(shown.token, poison);
    assert_eq!(
        read_mark(&client, "orders/1").await.unwrap().unwrap().token,
        poison
    );
    assert_eq!(read_mark(&client, "orders/2").await.unwrap(), None);

    // Refusals: no reason, not lower, no mark. Nothing changes.
    let e = store.reset("orders/1", e0(120), "  ").await.unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::BadReset, "{e}");
    assert!(e.to_string().contains("reason"), "{e}");
    let e = store.reset("orders/1", poison, "same").await.unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::BadReset, "{e}");
    assert!(e.to_string().contains("not below"), "{e}");
    let e = reset_mark(&client, "orders/2", e0(1), "none")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), FenceErrorKind::NoMark, "{e}");
    assert!(read_resets(&client, "orders/1", 10)
        .await
        .unwrap()
        .is_empty());

    // The reset: to the token of the current hold.
    let old = store
        .reset("orders/1", e0(120), "epoch-1 token from the example")
        .await
        .unwrap();
    assert_eq!(old, poison);
    assert_eq!(
        store.mark("orders/1").await.unwrap().unwrap().token,
        e0(120)
    );
    assert_eq!(
        store.raise("orders/1", e0(120)).await.unwrap(),
        Raise::Admitted
    );
    assert_eq!(
        store.raise("orders/1", e0(100)).await.unwrap(),
        Raise::Stale { highest: e0(120) },
        "the older holder stays refused"
    );
    let log = read_resets(&client, "orders/1", 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (
            log[0].old,
            log[0].new,
            log[0].reason.as_str(),
            log[0].reset_by.as_str()
        ),
        (
            poison,
            e0(120),
            "epoch-1 token from the example",
            "postgres"
        )
    );
}

/// A reset waits for a fenced transaction in flight on the resource (it takes the
/// resource's lock exclusive), so it never lowers a mark under a running writer.
#[tokio::test]
async fn a_reset_waits_for_the_fenced_transactions_in_flight() {
    let (db, client) = fresh_db().await;
    let mut writer = db.connect().await;
    let tx = begin_fenced(&mut writer, "r", tok(9)).await.unwrap();
    let resetter = db.connect().await;
    let reset = tokio::spawn(async move { reset_mark(&resetter, "r", tok(5), "test").await });
    // The reset is blocked on the lock: Postgres shows it waiting for an advisory lock.
    let mut waiting = false;
    for _ in 0..200 {
        waiting = client
            .query_one(
                "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waiting, "the reset did not wait for the writer's lock");
    assert!(!reset.is_finished());
    tx.commit().await.unwrap();
    assert_eq!(reset.await.unwrap().unwrap(), tok(9));
    assert_eq!(
        read_mark(&client, "r").await.unwrap().unwrap().token,
        tok(5)
    );
}
