//! Fenced writes straight to PostgreSQL, without an HTTP service in between: the token
//! check and the write are one transaction, so a stale writer's write never commits.
//!
//! ```sh
//! cargo run --example pg_conditional_write -- "host=127.0.0.1 user=postgres dbname=postgres"
//! ```
//!
//! Two forms:
//!
//! 1. `fenced_transaction`: any statements on any tables, guarded by the resource's row in
//!    `fence_high_water` (created by `palisade_fence::migrate`).
//! 2. `FencedUpdate`: a table with its own `fence_token` column; the check is part of the
//!    `UPDATE` (one statement, no high-water row).
//!
//! In real code the tokens come from lock holds (`hold.token()`); here they are composed
//! by hand: token 7 is a newer holder than token 5.

use palisade_fence::{fenced_transaction, Epoch, FenceError, FencedUpdate, FencingToken, Revision};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let conn = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "host=127.0.0.1 user=postgres dbname=postgres".into());
    let (mut client, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);

    palisade_fence::migrate(&mut client).await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS example_ledger (entry text NOT NULL, token bigint NOT NULL);
             CREATE TABLE IF NOT EXISTS example_account (id text PRIMARY KEY, balance bigint NOT NULL, fence_token bigint);
             INSERT INTO example_account (id, balance) VALUES ('acct-1', 0) ON CONFLICT DO NOTHING",
        )
        .await?;
    let token = |rev| FencingToken::from_parts(Epoch::ZERO, Revision::new(rev)).expect("in range");
    // A fresh resource name per run, so the example can be run again.
    let resource = format!("example/ledger/{}", std::process::id());

    // 1. fenced_transaction: the body runs only if the token is not below the mark.
    for t in [token(5), token(7), token(5)] {
        let result = fenced_transaction(&mut client, &resource, t, |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO example_ledger (entry, token) VALUES ('payment', $1)",
                    &[&t],
                )
                .await?;
                Ok::<_, FenceError>(())
            })
        })
        .await;
        match result {
            Ok(()) => println!("fenced_transaction with token {t}: committed"),
            // The stale writer learns the mark it lost to; nothing of it was written.
            Err(e) if e.is_stale() => println!(
                "fenced_transaction with token {t}: refused, the resource has seen {}",
                e.highest().unwrap_or(t)
            ),
            Err(e) => return Err(e.into()),
        }
    }

    // 2. FencedUpdate: `UPDATE … SET balance = …, fence_token = $1 WHERE id = $2 AND
    //    (fence_token IS NULL OR fence_token <= $1)`.
    client
        .execute(
            "UPDATE example_account SET fence_token = NULL WHERE id = 'acct-1'",
            &[],
        )
        .await?;
    let update = FencedUpdate::new("example_account", "id");
    for (t, balance) in [(token(5), 10_i64), (token(7), 20), (token(5), 30)] {
        match update
            .execute(&client, &"acct-1", "balance = $3", &[&balance], t)
            .await
        {
            Ok(n) => println!("FencedUpdate with token {t}: {n} row(s) set to {balance}"),
            Err(e) if e.is_stale() => println!(
                "FencedUpdate with token {t}: refused, the resource has seen {}",
                e.highest().unwrap_or(t)
            ),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
