//! Postgres: a plain `UPDATE` against the same `UPDATE` fenced three ways
//! (`fenced_transaction`, `fenced_execute`, `FencedUpdate`), and unfenced in a
//! transaction of its own, a round trip per statement (the closure form's floor) and
//! pipelined (the one-round-trip forms' floor), at several client counts.
//!
//! Each client has its own connection and its own rows (client `i` of `c` writes ids
//! `i+1, i+1+c, ...`) and writes each row `writes_per_token` times in a row under one
//! token, then takes a new token from one global counter for the next row: with 1, every
//! fenced write raises the mark (the worst case); with more, a holder writes again under
//! its hold and only the first write raises. Every fenced write is admitted: the bench
//! measures the cost of the check, not refusals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{
    fenced_execute, fenced_transaction, migrate, FenceError, FencedUpdate, FencingToken,
    PreparedFence, PreparedFencedUpdate,
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
    /// Writes each client makes to one row under one token before it moves to its next
    /// row with a new token; one table section per value.
    pub(crate) writes_per_token: Vec<usize>,
    /// Writes per variant in the server-CPU table (one client, one after another); 0
    /// skips the table.
    pub(crate) cpu_writes: usize,
}

/// The variants, in the order they take turns. The last is no fenced write: the same
/// `UPDATE` in a transaction of its own (`BEGIN`, the `UPDATE`, `COMMIT`, a round trip
/// each), what `fenced_transaction` costs without its raise: the floor of the closure form.
const VARIANTS: [&str; 8] = [
    "plain UPDATE",
    "fenced_transaction",
    "fenced_execute",
    "PreparedFence",
    "FencedUpdate (folded)",
    "PreparedFencedUpdate (folded)",
    "BEGIN + UPDATE + COMMIT (no check)",
    "BEGIN + UPDATE + COMMIT pipelined (no check)",
];
/// Each variant's own floor, what its ratio is taken against: the same work without the
/// check. `fenced_transaction` against the transaction with a round trip per statement;
/// the one-round-trip forms against the same pipeline without the raise; the folded
/// forms against the plain `UPDATE`.
const FLOOR: [usize; 8] = [0, 6, 7, 7, 0, 0, 6, 7];
const TARGETS: [&str; 8] = [
    "", ">= 0.85x", ">= 0.85x", ">= 0.85x", ">= 0.95x", ">= 0.95x", "", "",
];
const PLAIN: &str = "UPDATE bench_account SET balance = balance + 1 WHERE id = $1";

/// The server-CPU table's extra variant: [`VARIANTS`]' `PreparedFence` pipeline with the
/// raise written as one plain SQL statement instead of the PL/pgSQL call, to weigh the
/// function call's own cost. Not a shipped form: it always takes the resource's lock
/// exclusive and rewrites the mark row (so writers with one token take turns), and a
/// refused token returns no row instead of aborting. Every token the bench sends is
/// admitted.
const SQL_RAISE_VARIANT: &str = "PreparedFence, plain-SQL raise (bench only)";
const SQL_RAISE: &str = "WITH l AS MATERIALIZED \
     (SELECT pg_advisory_xact_lock(1885432937, hashtext($1::text))), \
     up AS (INSERT INTO palisade_fence.fence_high_water AS h (resource, token, updated_at) \
     SELECT $1::text, $2::bigint, now() FROM l \
     ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now() \
     WHERE h.token <= EXCLUDED.token RETURNING h.token) \
     SELECT token FROM up";

/// Runs the comparison on a fresh database and returns its tables: the interleaved
/// rates, then (unless `cpu_writes` is 0) the server's CPU time per write.
pub(crate) async fn run(args: &PgArgs) -> Result<Vec<Table>> {
    let db = TestDb::create().await;
    let mut setup = db.connect().await;
    migrate(&mut setup).await?;
    setup
        .batch_execute(&format!(
            "CREATE TABLE bench_account (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint); \
             INSERT INTO bench_account SELECT g, 0, NULL FROM generate_series(1, {rows}) g; \
             INSERT INTO palisade_fence.fence_high_water (resource, token) SELECT 'account/' || g, 0 FROM generate_series(1, {rows}) g",
            rows = args.rows
        ))
        .await?;
    setup.batch_execute("VACUUM ANALYZE bench_account").await?;
    setup
        .batch_execute("VACUUM ANALYZE palisade_fence.fence_high_water")
        .await?;
    let clock = Arc::new(AtomicU64::new(
        FencingToken::from_u64(1 << 48).map_or(1, |t| t.get()),
    ));
    let folded = FencedUpdate::new("bench_account", "id");
    let mut table = Table::new(
        format!(
            "Postgres: fenced writes vs a plain UPDATE ({} rows, synchronous_commit {}, {} s x {} rounds per cell; ratio = median of per-round ratios)",
            args.rows,
            if args.synchronous_commit { "on" } else { "off" },
            args.secs.as_secs_f64(),
            args.rounds
        ),
        &["clients", "writes/token", "variant", "writes/s", "p50 ms", "p99 ms", "vs plain", "vs floor", "target"],
    );
    for &per_token in &args.writes_per_token {
        for &c in &args.clients {
            cell(&db, args, &folded, &clock, c, per_token, &mut table).await?;
        }
    }
    let mut tables = vec![table];
    if args.cpu_writes > 0 {
        tables.push(server_cpu(&db, args, &folded, &clock).await?);
    }
    Ok(tables)
}

/// One client count and writes-per-token setting: every variant, interleaved.
async fn cell(
    db: &TestDb,
    args: &PgArgs,
    folded: &FencedUpdate,
    clock: &Arc<AtomicU64>,
    c: usize,
    per_token: usize,
    table: &mut Table,
) -> Result<()> {
    eprintln!("pg: {c} clients, {per_token} writes per token");
    // One connection per client, shared by the variants (they never run at once).
    let mut conns = Vec::with_capacity(c);
    for _ in 0..c {
        conns.push(connect(db, args, folded).await?);
    }
    let mut writes = Vec::with_capacity(c);
    for i in 0..c {
        let ids: Vec<i64> = (i as i64 + 1..=args.rows).step_by(c).collect();
        if ids.is_empty() {
            return Err(BenchError::Unexpected("more clients than rows"));
        }
        writes.push(Writes::new(ids, per_token, clock));
    }
    let mut variants: Vec<Vec<Op>> = Vec::new();
    for v in 0..VARIANTS.len() {
        let mut ops = Vec::with_capacity(c);
        for ((client, prepared), writes) in conns.iter().zip(&writes) {
            ops.push(worker(
                v,
                Arc::clone(client),
                prepared.clone(),
                Arc::clone(writes),
                folded.clone(),
            ));
        }
        variants.push(ops);
    }
    let run = interleave(variants, args.rounds, args.secs).await?;
    for (v, s) in run.merged.iter().enumerate() {
        table.row(vec![
            c.to_string(),
            per_token.to_string(),
            VARIANTS[v].to_owned(),
            f(s.rate(), 0),
            f(s.ms(0.5), 2),
            f(s.ms(0.99), 2),
            ratio(run.ratio(v, 0)),
            if FLOOR[v] != v {
                ratio(run.ratio(v, FLOOR[v]))
            } else {
                String::new()
            },
            TARGETS[v].to_owned(),
        ]);
    }
    Ok(())
}

/// One client's connection with its prepared statements.
async fn connect(
    db: &TestDb,
    args: &PgArgs,
    folded: &FencedUpdate,
) -> Result<(Arc<Mutex<tokio_postgres::Client>>, Prepared)> {
    let client = db.connect().await;
    if !args.synchronous_commit {
        client.batch_execute("SET synchronous_commit = off").await?;
    }
    let plain = client.prepare(PLAIN).await?;
    let fence = PreparedFence::prepare(&client).await?;
    let prepared = folded.prepare(&client, "balance = balance + 1").await?;
    let sql_raise = client.prepare(SQL_RAISE).await?;
    Ok((
        Arc::new(Mutex::new(client)),
        Prepared {
            plain,
            fence,
            folded: prepared,
            sql_raise,
        },
    ))
}

/// CPU time (user + system) of process `pid` in microseconds, from `/proc/<pid>/stat`
/// (10 ms ticks).
fn process_cpu_us(pid: i32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => Ok((u + s) * 10_000),
        _ => Err(BenchError::Unexpected("no CPU times in /proc/<pid>/stat")),
    }
}

/// The server's side of each variant: one client writes `cpu_writes` times, one write
/// after another, and the CPU time its backend process used (from `/proc`, so only a
/// server on this machine) is divided by the writes. Round trips cost the server
/// nothing while it waits, so this is the work of the statements themselves.
async fn server_cpu(
    db: &TestDb,
    args: &PgArgs,
    folded: &FencedUpdate,
    clock: &Arc<AtomicU64>,
) -> Result<Table> {
    let (client, prepared) = connect(db, args, folded).await?;
    let pid: i32 = client
        .lock()
        .await
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let ids: Vec<i64> = (1..=args.rows).collect();
    let mut table = Table::new(
        format!(
            "Postgres: server CPU per write, one client, {} writes per variant (backend's CPU time from /proc, 10 ms ticks; synchronous_commit {})",
            args.cpu_writes,
            if args.synchronous_commit { "on" } else { "off" },
        ),
        &["writes/token", "variant", "server CPU µs/write", "vs plain"],
    );
    for &per_token in &args.writes_per_token {
        let writes = Writes::new(ids.clone(), per_token, clock);
        let mut base = 0.0;
        let names = VARIANTS.iter().chain(std::iter::once(&SQL_RAISE_VARIANT));
        for (v, name) in names.enumerate() {
            let mut op = worker(
                v,
                Arc::clone(&client),
                prepared.clone(),
                Arc::clone(&writes),
                folded.clone(),
            );
            // Warm up (plans, caches), then measure.
            for _ in 0..args.cpu_writes.min(200) {
                op().await?;
            }
            let before = process_cpu_us(pid)?;
            for _ in 0..args.cpu_writes {
                op().await?;
            }
            let us = process_cpu_us(pid)?.saturating_sub(before) as f64 / args.cpu_writes as f64;
            if v == 0 {
                base = us;
            }
            table.row(vec![
                per_token.to_string(),
                (*name).to_owned(),
                f(us, 1),
                ratio(if base > 0.0 { us / base } else { 0.0 }),
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
    /// [`SQL_RAISE`], for the server-CPU table only.
    sql_raise: tokio_postgres::Statement,
}

/// One client's sequence of writes: `per_token` writes to one of its rows under one
/// token, then its next row with a new token from the global clock. Shared by the
/// client's variants (they take turns and never run at once), so the token of a row only
/// grows whichever variant writes next, and a hold cut by a turn continues in the next.
#[derive(Debug)]
struct Writes {
    ids: Vec<i64>,
    per_token: usize,
    next: usize,
    token: FencingToken,
    clock: Arc<AtomicU64>,
}

impl Writes {
    fn new(
        ids: Vec<i64>,
        per_token: usize,
        clock: &Arc<AtomicU64>,
    ) -> Arc<std::sync::Mutex<Writes>> {
        let per_token = per_token.max(1);
        Arc::new(std::sync::Mutex::new(Writes {
            ids,
            per_token,
            next: 0,
            token: FencingToken::MIN,
            clock: Arc::clone(clock),
        }))
    }

    /// The row and token of the next write.
    fn next(&mut self) -> (i64, FencingToken) {
        let id = self.ids[(self.next / self.per_token) % self.ids.len()];
        if self.next % self.per_token == 0 {
            self.token = FencingToken::from_u64(self.clock.fetch_add(1, Ordering::Relaxed))
                .unwrap_or(FencingToken::MAX);
        }
        self.next += 1;
        (id, self.token)
    }
}

/// One client's loop body for variant `v`, writing the client's next write.
fn worker(
    v: usize,
    client: Arc<Mutex<tokio_postgres::Client>>,
    prepared: Prepared,
    writes: Arc<std::sync::Mutex<Writes>>,
    folded: FencedUpdate,
) -> Op {
    Box::new(move || {
        let (id, token) = match writes.lock() {
            Ok(mut w) => w.next(),
            Err(poisoned) => poisoned.into_inner().next(),
        };
        let (client, p, folded) = (Arc::clone(&client), prepared.clone(), folded.clone());
        Box::pin(async move {
            let mut c = client.lock().await;
            let resource = format!("account/{id}");
            let plain = &p.plain;
            let n = match v {
                0 => c.execute(plain, &[&id]).await?,
                1 => {
                    let plain = plain.clone();
                    fenced_transaction(&mut c, &resource, token, move |tx| {
                        Box::pin(
                            async move { Ok::<_, FenceError>(tx.execute(&plain, &[&id]).await?) },
                        )
                    })
                    .await?
                }
                2 => fenced_execute(&c, &resource, token, &[(plain, &[&id])]).await?[0],
                3 => {
                    p.fence
                        .execute(&c, &resource, token, &[(plain, &[&id])])
                        .await?[0]
                }
                4 => {
                    folded
                        .execute(&*c, &id, "balance = balance + 1", &[], token)
                        .await?
                }
                5 => p.folded.execute(&*c, &id, &[], token).await?,
                6 => {
                    let tx = c.transaction().await?;
                    let n = tx.execute(plain, &[&id]).await?;
                    tx.commit().await?;
                    n
                }
                8 => {
                    // PreparedFence's pipeline with the plain-SQL raise, in one flight.
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                    let raise: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
                        [&resource, &token];
                    let (begin, raised, n, commit) = tokio::join!(
                        c.batch_execute("BEGIN"),
                        c.query(&p.sql_raise, &raise),
                        c.execute(plain, &params),
                        c.batch_execute("COMMIT")
                    );
                    begin?;
                    if raised?.len() != 1 {
                        return Err(BenchError::Unexpected(
                            "the plain-SQL raise refused a token",
                        ));
                    }
                    commit?;
                    n?
                }
                _ => {
                    // Polled together in this order: sent in one flight.
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                    let (begin, n, commit) = tokio::join!(
                        c.batch_execute("BEGIN"),
                        c.execute(plain, &params),
                        c.batch_execute("COMMIT")
                    );
                    begin?;
                    commit?;
                    n?
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
