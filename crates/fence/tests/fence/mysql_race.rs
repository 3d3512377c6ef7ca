//! Writers racing on MariaDB: many transactions raise the same resource's first mark at
//! once, with different tokens, at `REPEATABLE READ` and at `READ COMMITTED`. The
//! committed writes must carry non-decreasing tokens in commit order, each must have seen
//! every write committed before it, and every lower token is refused with a mark that
//! was committed.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::IsolationLevel;
use palisade_fence::mysql::{begin_fenced, MysqlFenceError};
use palisade_fence::FencingToken;
use tokio::sync::Barrier;

use crate::common::{pause, shuffle, tok};
use crate::mysql_helper::{fresh_mysql, opts};

const WRITERS: u64 = 24;

/// What one writer ended with.
enum Outcome {
    Committed,
    Refused(FencingToken),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_first_writers_racing_commit_in_token_order_at_repeatable_read_and_read_committed() {
    let (db, mut setup) = fresh_mysql().await;
    setup
        .query_drop(
            "CREATE TABLE writes (id BIGINT AUTO_INCREMENT PRIMARY KEY, resource VARCHAR(64) NOT NULL, \
             token BIGINT NOT NULL, seen BIGINT NOT NULL) ENGINE=InnoDB",
        )
        .await
        .unwrap();
    let mut retries = 0;
    for (round, level) in [
        IsolationLevel::RepeatableRead,
        IsolationLevel::ReadCommitted,
        IsolationLevel::RepeatableRead,
        IsolationLevel::ReadCommitted,
    ]
    .into_iter()
    .enumerate()
    {
        let resource = format!("first/{round}");
        let mut tokens: Vec<FencingToken> = (1..=WRITERS).map(|i| tok(i * 3)).collect();
        shuffle(&mut tokens, 0x5eed + round as u64);
        let barrier = Arc::new(Barrier::new(tokens.len()));
        let mut tasks = Vec::new();
        for &token in &tokens {
            let mut conn = db.connect().await;
            let (barrier, resource) = (Arc::clone(&barrier), resource.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut retries = 0;
                loop {
                    match write(&mut conn, level, &resource, token).await {
                        Ok(()) => return (token, Outcome::Committed, retries),
                        Err(e) if e.is_stale() => {
                            return (token, Outcome::Refused(e.highest().unwrap()), retries)
                        }
                        Err(e) if e.is_retryable() => retries += 1,
                        Err(e) => panic!("{level:?} writer {token}: {e:?}"),
                    }
                }
            }));
        }
        let mut outcomes = Vec::new();
        for t in tasks {
            let (token, outcome, r) = t.await.unwrap();
            retries += r;
            outcomes.push((token, outcome));
        }
        let rows: Vec<(u64, u64)> = setup
            .exec(
                "SELECT token, seen FROM writes WHERE resource = ? ORDER BY id",
                (resource.as_str(),),
            )
            .await
            .unwrap();
        let committed: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert!(
            committed.windows(2).all(|w| w[0] <= w[1]),
            "{level:?}: commits out of token order: {committed:?}"
        );
        let mut previous = 0;
        for &(token, seen) in &rows {
            assert_eq!(
                seen, previous,
                "{level:?}: writer {token} saw {seen}, but {previous} had committed before it"
            );
            previous = token;
        }
        let max = tokens.iter().max().unwrap().get();
        assert_eq!(
            committed.last(),
            Some(&max),
            "{level:?}: the highest token commits"
        );
        let mut n_committed = 0;
        for (token, outcome) in &outcomes {
            match outcome {
                Outcome::Committed => {
                    n_committed += 1;
                    assert!(committed.contains(&token.get()), "{level:?}: {token}");
                }
                Outcome::Refused(highest) => {
                    assert!(highest > token, "{level:?}: {token} refused by {highest}");
                    assert!(
                        committed.contains(&highest.get()),
                        "{level:?}: {token} refused by {highest}, which never committed"
                    );
                }
            }
        }
        assert_eq!(n_committed, committed.len(), "{level:?}");
        let mark: u64 = setup
            .exec_first(
                "SELECT token FROM fence_high_water WHERE resource = ?",
                (resource.as_str(),),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(mark, max, "{level:?}: the mark is the highest token");
    }
    // Deadlocks are allowed (retryable) but must stay rare: the raise is built so that
    // first writers queue on the new row's lock rather than deadlock on an upgrade.
    assert!(retries <= WRITERS as usize, "{retries} retries in 4 rounds");
}

/// One fenced write: the raise, a read of what was committed before, a pause (so that a
/// writer not held back by the lock would overtake), the insert, the commit.
async fn write(
    conn: &mut mysql_async::Conn,
    level: IsolationLevel,
    resource: &str,
    token: FencingToken,
) -> Result<(), MysqlFenceError> {
    let mut tx = begin_fenced(conn, opts(level), resource, token).await?;
    let result: Result<(), MysqlFenceError> = async {
        let seen: Option<u64> = tx
            .exec_first(
                "SELECT COALESCE(MAX(token), 0) FROM writes WHERE resource = ?",
                (resource,),
            )
            .await?;
        tokio::time::sleep(Duration::from_secs_f64(pause(token))).await;
        tx.exec_drop(
            "INSERT INTO writes (resource, token, seen) VALUES (?, ?, ?)",
            (resource, token.get(), seen.unwrap_or(0)),
        )
        .await?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Ok(tx.commit().await?),
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}
