//! MariaDB: the folded `UPDATE` (`FencedUpdate`, the check in the write's own `WHERE`)
//! against the plain `UPDATE`, and `fence_raise` in a transaction against the same
//! transaction without it, at several client counts.
//!
//! Each client has its own connection and its own rows (client `i` of `c` writes ids
//! `i+1, i+1+c, ...`) and takes a new token from one global counter for every write, so
//! every fenced write raises the mark (the worst case). Every fenced write is admitted:
//! the bench measures the cost of the check, not refusals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};
use palisade_fence::mysql::{begin_fenced, migrate, FencedUpdate};
use palisade_fence::FencingToken;
use palisade_testkit::TestMysqlDb;

use crate::drive::{interleave, Op};
use crate::error::{BenchError, Result};
use crate::report::{f, ratio, Table};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct MysqlArgs {
    pub(crate) clients: Vec<usize>,
    pub(crate) rows: i64,
    pub(crate) secs: Duration,
    pub(crate) rounds: usize,
}

/// The variants, in the order they take turns, and the base each one's ratio is taken
/// against: the folded form against the plain `UPDATE`, the raise in a transaction
/// against the same transaction without it.
const VARIANTS: [&str; 4] = [
    "plain UPDATE",
    "FencedUpdate (folded)",
    "BEGIN + UPDATE + COMMIT (no check)",
    "BEGIN + fence_raise + UPDATE + COMMIT",
];
const BASE: [usize; 4] = [0, 0, 2, 2];
const TARGETS: [&str; 4] = ["", ">= 0.95x", "", "reported"];
const PLAIN: &str = "UPDATE bench_account SET balance = balance + 1 WHERE id = ?";

/// Runs the comparison on a fresh database and returns its table.
pub(crate) async fn run(args: &MysqlArgs) -> Result<Table> {
    let db = TestMysqlDb::create().await;
    let mut setup = db.connect().await;
    migrate(&mut setup).await?;
    setup
        .query_drop(
            "CREATE TABLE bench_account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, \
             fence_token BIGINT NULL) ENGINE = InnoDB",
        )
        .await?;
    // Rows and marks in chunks (one statement each).
    let ids: Vec<i64> = (1..=args.rows).collect();
    for chunk in ids.chunks(1_000) {
        let rows: Vec<String> = chunk.iter().map(|i| format!("({i}, 0, NULL)")).collect();
        let marks: Vec<String> = chunk
            .iter()
            .map(|i| format!("('account/{i}', 0, UTC_TIMESTAMP(6))"))
            .collect();
        setup
            .query_drop(format!(
                "INSERT INTO bench_account VALUES {}; INSERT INTO fence_high_water VALUES {}",
                rows.join(","),
                marks.join(",")
            ))
            .await?;
    }
    setup
        .query_drop("ANALYZE TABLE bench_account, fence_high_water")
        .await?;
    let version: Option<String> = setup.query_first("SELECT VERSION()").await?;
    let clock = Arc::new(AtomicU64::new(
        FencingToken::from_u64(1 << 48).map_or(1, |t| t.get()),
    ));
    let mut table = Table::new(
        format!(
            "MariaDB {}: fenced writes vs their unfenced floor ({} rows, a new token every write, {} s x {} rounds per cell; ratio = median of per-round ratios)",
            version.unwrap_or_default(),
            args.rows,
            args.secs.as_secs_f64(),
            args.rounds
        ),
        &["clients", "variant", "writes/s", "p50 ms", "p99 ms", "vs base", "base", "target"],
    );
    for &c in &args.clients {
        cell(&db, args, &clock, c, &mut table).await?;
    }
    Ok(table)
}

/// One client count: every variant, interleaved.
async fn cell(
    db: &TestMysqlDb,
    args: &MysqlArgs,
    clock: &Arc<AtomicU64>,
    c: usize,
    table: &mut Table,
) -> Result<()> {
    eprintln!("mysql: {c} clients");
    let mut conns = Vec::with_capacity(c);
    let mut rows = Vec::with_capacity(c);
    for i in 0..c {
        let ids: Vec<i64> = (i as i64 + 1..=args.rows).step_by(c).collect();
        if ids.is_empty() {
            return Err(BenchError::Unexpected("more clients than rows"));
        }
        conns.push(Arc::new(tokio::sync::Mutex::new(db.connect().await)));
        rows.push(Arc::new(ids));
    }
    let folded = FencedUpdate::new("bench_account", "id");
    let mut variants: Vec<Vec<Op>> = Vec::new();
    for v in 0..VARIANTS.len() {
        let ops = conns
            .iter()
            .zip(&rows)
            .map(|(conn, ids)| {
                worker(
                    v,
                    Arc::clone(conn),
                    Arc::clone(ids),
                    Arc::clone(clock),
                    folded.clone(),
                )
            })
            .collect();
        variants.push(ops);
    }
    let run = interleave(variants, args.rounds, args.secs).await?;
    for (v, s) in run.merged.iter().enumerate() {
        table.row(vec![
            c.to_string(),
            VARIANTS[v].to_owned(),
            f(s.rate(), 0),
            f(s.ms(0.5), 2),
            f(s.ms(0.99), 2),
            ratio(run.ratio(v, BASE[v])),
            VARIANTS[BASE[v]].to_owned(),
            TARGETS[v].to_owned(),
        ]);
    }
    for conn in conns {
        if let Ok(conn) = Arc::try_unwrap(conn) {
            let _ = conn.into_inner().disconnect().await;
        }
    }
    Ok(())
}

/// One client's loop body for variant `v`: the next of its rows, a new token.
fn worker(
    v: usize,
    conn: Arc<tokio::sync::Mutex<Conn>>,
    ids: Arc<Vec<i64>>,
    clock: Arc<AtomicU64>,
    folded: FencedUpdate,
) -> Op {
    let mut next = 0_usize;
    Box::new(move || {
        let id = ids[next % ids.len()];
        next += 1;
        let token = FencingToken::from_u64(clock.fetch_add(1, Ordering::Relaxed))
            .unwrap_or(FencingToken::MAX);
        let (conn, folded) = (Arc::clone(&conn), folded.clone());
        Box::pin(async move {
            let mut c = conn.lock().await;
            let n = match v {
                0 => {
                    let r = c.exec_iter(PLAIN, (id,)).await?;
                    let n = r.affected_rows();
                    r.drop_result().await?;
                    n
                }
                1 => {
                    folded
                        .execute(&mut *c, id, "balance = balance + 1", Vec::new(), token)
                        .await?
                }
                2 => {
                    let mut tx = c.start_transaction(TxOpts::default()).await?;
                    tx.exec_drop(PLAIN, (id,)).await?;
                    let n = tx.affected_rows();
                    tx.commit().await?;
                    n
                }
                _ => {
                    let resource = format!("account/{id}");
                    let mut tx = begin_fenced(&mut c, TxOpts::default(), &resource, token).await?;
                    tx.exec_drop(PLAIN, (id,)).await?;
                    let n = tx.affected_rows();
                    tx.commit().await?;
                    n
                }
            };
            if n == 1 {
                Ok(())
            } else {
                Err(BenchError::Unexpected(
                    "an update did not change exactly one row",
                ))
            }
        })
    })
}
