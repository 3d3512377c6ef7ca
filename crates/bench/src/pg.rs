//! Postgres: a plain `UPDATE` against the same `UPDATE` fenced three ways
//! (`fenced_transaction`, `fenced_execute`, `FencedUpdate`), at several client counts.
//!
//! Each client has its own connection and its own rows (client `i` of `c` writes ids
//! `i+1, i+1+c, ...`), and every write carries a token from one global counter, so every
//! fenced write is admitted: the bench measures the cost of the check, not refusals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{
    fenced_execute, fenced_transaction, migrate, FenceError, FencedUpdate, FencingToken, PreparedFence, PreparedFencedUpdate,
};
use palisade_testkit::TestDb;
use tokio::sync::Mutex;

use crate::drive::{interleave, Op};
use crate::error::{BenchError, Result};
use crate::report::{f, ratio, Table};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct PgArgs {
    pub(crate) clients: Vec<usize>,
    pub(crate) rows: i64,
    pub(crate) secs: Duration,
    pub(crate) rounds: usize,
    /// `synchronous_commit` of the bench's sessions: `on` waits for the WAL flush of every
    /// commit (durable, the default); `off` leaves CPU and round trips as the cost.
    pub(crate) synchronous_commit: bool,
}

const VARIANTS: [&str; 6] = [
    "plain UPDATE",
    "fenced_transaction",
    "fenced_execute",
    "PreparedFence",
    "FencedUpdate (folded)",
    "PreparedFencedUpdate (folded)",
];
const TARGETS: [&str; 6] = ["", ">= 0.85x", ">= 0.85x", ">= 0.85x", ">= 0.95x", ">= 0.95x"];
const PLAIN: &str = "UPDATE bench_account SET balance = balance + 1 WHERE id = $1";

/// Runs the comparison on a fresh database and returns its table.
pub(crate) async fn run(args: &PgArgs) -> Result<Table> {
    let db = TestDb::create().await;
    let mut setup = db.connect().await;
    migrate(&mut setup).await?;
    setup
        .batch_execute(&format!(
            "CREATE TABLE bench_account (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint); \
             INSERT INTO bench_account SELECT g, 0, NULL FROM generate_series(1, {rows}) g; \
             INSERT INTO fence_high_water (resource, token) SELECT 'account/' || g, 0 FROM generate_series(1, {rows}) g",
            rows = args.rows
        ))
        .await?;
    setup.batch_execute("VACUUM ANALYZE bench_account").await?;
    setup.batch_execute("VACUUM ANALYZE fence_high_water").await?;
    let clock = Arc::new(AtomicU64::new(FencingToken::from_u64(1 << 48).map_or(1, |t| t.get())));
    let folded = FencedUpdate::new("bench_account", "id");
    let mut table = Table::new(
        format!(
            "Postgres: fenced writes vs a plain UPDATE ({} rows, synchronous_commit {}, {} s x {} rounds per cell; ratio = median of per-round ratios)",
            args.rows,
            if args.synchronous_commit { "on" } else { "off" },
            args.secs.as_secs_f64(),
            args.rounds
        ),
        &["clients", "variant", "writes/s", "p50 ms", "p99 ms", "vs plain", "target"],
    );
    for &c in &args.clients {
        eprintln!("pg: {c} clients");
        // One connection per client, shared by the variants (they never run at once).
        let mut conns = Vec::with_capacity(c);
        for _ in 0..c {
            let client = db.connect().await;
            if !args.synchronous_commit {
                client.batch_execute("SET synchronous_commit = off").await?;
            }
            let plain = client.prepare(PLAIN).await?;
            let fence = PreparedFence::prepare(&client).await?;
            let prepared = folded.prepare(&client, "balance = balance + 1").await?;
            conns.push((Arc::new(Mutex::new(client)), Prepared { plain, fence, folded: prepared }));
        }
        let mut variants: Vec<Vec<Op>> = Vec::new();
        for v in 0..VARIANTS.len() {
            let mut ops = Vec::with_capacity(c);
            for (i, (client, prepared)) in conns.iter().enumerate() {
                let ids: Vec<i64> = (i as i64 + 1..=args.rows).step_by(c).collect();
                if ids.is_empty() {
                    return Err(BenchError::Unexpected("more clients than rows"));
                }
                ops.push(worker(v, Arc::clone(client), prepared.clone(), ids, Arc::clone(&clock), folded.clone()));
            }
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
                ratio(run.ratio(v, 0)),
                TARGETS[v].to_owned(),
            ]);
        }
    }
    Ok(table)
}

/// The statements one connection prepared.
#[derive(Debug, Clone)]
struct Prepared {
    plain: tokio_postgres::Statement,
    fence: PreparedFence,
    folded: PreparedFencedUpdate,
}

/// One client's loop body for variant `v`.
fn worker(
    v: usize,
    client: Arc<Mutex<tokio_postgres::Client>>,
    prepared: Prepared,
    ids: Vec<i64>,
    clock: Arc<AtomicU64>,
    folded: FencedUpdate,
) -> Op {
    let mut next = 0usize;
    Box::new(move || {
        let id = ids[next % ids.len()];
        next += 1;
        let token = FencingToken::from_u64(clock.fetch_add(1, Ordering::Relaxed)).unwrap_or(FencingToken::MAX);
        let (client, p, folded) = (Arc::clone(&client), prepared.clone(), folded.clone());
        Box::pin(async move {
            let mut c = client.lock().await;
            let resource = format!("account/{id}");
            let plain = &p.plain;
            let n = match v {
                0 => c.execute(plain, &[&id]).await?,
                1 => {
                    let plain = plain.clone();
                    fenced_transaction(&mut *c, &resource, token, move |tx| {
                        Box::pin(async move { Ok::<_, FenceError>(tx.execute(&plain, &[&id]).await?) })
                    })
                    .await?
                }
                2 => fenced_execute(&c, &resource, token, &[(plain, &[&id])]).await?[0],
                3 => p.fence.execute(&c, &resource, token, &[(plain, &[&id])]).await?[0],
                4 => folded.execute(&*c, &id, "balance = balance + 1", &[], token).await?,
                _ => p.folded.execute(&*c, &id, &[], token).await?,
            };
            if n == 1 {
                Ok(())
            } else {
                Err(BenchError::Unexpected("an update did not change exactly one row"))
            }
        })
    })
}
