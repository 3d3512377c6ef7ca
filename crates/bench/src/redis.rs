//! Redis: `fenced_set` (the check and the `SET` in one `FCALL` of the `palisade_fence`
//! library) against a plain `SET`, at several client counts, on a private `redis-server`
//! (no persistence, a free port) started by the bench.
//!
//! Each client has its own connection and its own key and resource. Variants:
//! - plain `SET`: the base;
//! - `fenced_set` (FCALL), equal token: a holder writing again under its hold (the check
//!   reads the mark, which stays; the common case);
//! - `fenced_set` (FCALL), new token each write: every write also raises the mark (an
//!   `HSET` of the mark and a `TIME` in the same call; the worst case);
//! - `fenced_set` (EVALSHA fallback), equal token: the same Lua run as a script, as on a
//!   server without Redis Functions.
//!
//! Every fenced write is admitted: the bench measures the cost of the check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::redis::{RedisFence, RedisFenceError};
use palisade_fence::{Epoch, FencingToken, Revision};
use palisade_testkit::{RedisPersistence, RedisServer};
use redis::aio::MultiplexedConnection;

use crate::drive::{interleave, Op};
use crate::error::{BenchError, Result};
use crate::report::{f, ratio, Table};

const VARIANTS: [&str; 4] = [
    "plain SET",
    "fenced_set (FCALL), equal token",
    "fenced_set (FCALL), new token each write",
    "fenced_set (EVALSHA fallback), equal token",
];
const TARGETS: [&str; 4] = ["", ">= 0.8x", "", ""];
/// The command each variant sends, as `INFO commandstats` names it (`cmdstat_<name>`).
/// A function's or script's time includes the commands it runs.
const COMMANDS: [&str; 4] = ["set", "fcall", "fcall", "evalsha"];

/// The value every write sets (a small row).
const VALUE: &str = "status=paid;amount=1250;currency=EUR";

fn io(e: impl std::error::Error + Send + Sync + 'static) -> BenchError {
    BenchError::Io(std::io::Error::other(e))
}

fn fence_error(e: RedisFenceError) -> BenchError {
    io(e)
}

/// Starts the server, runs each client count, returns the tables: rates, and (unless
/// `cpu_writes` is 0) the server's time per write of each variant.
pub(crate) async fn run(
    clients: &[usize],
    secs: Duration,
    rounds: usize,
    cpu_writes: usize,
) -> Result<Vec<Table>> {
    let server = RedisServer::start(RedisPersistence::None)
        .await
        .map_err(io)?;
    let client = redis::Client::open(server.url()).map_err(io)?;
    let mut setup = client
        .get_multiplexed_async_connection()
        .await
        .map_err(io)?;
    let functions = RedisFence::load(&mut setup).await.map_err(fence_error)?;
    let eval = RedisFence::eval();
    let epoch = Epoch::new(1).map_err(|_| BenchError::Unexpected("epoch 1 is in range"))?;
    let mut table = Table::new(
        format!(
            "Redis 7: fenced_set vs plain SET, one connection per client, a private redis-server without persistence ({} s x {rounds} rounds per cell; ratio = median of per-round ratios)",
            secs.as_secs_f64()
        ),
        &["clients", "variant", "writes/s", "p50 ms", "p99 ms", "vs plain SET", "target"],
    );
    for &n in clients {
        let mut variants: Vec<Vec<Op>> = (0..VARIANTS.len()).map(|_| Vec::new()).collect();
        for i in 0..n {
            let key = format!("{{bench-{n}-{i}}}:v");
            let base = FencingToken::from_parts(epoch, Revision::new(1_000 + i as u64))
                .map_err(|_| BenchError::Unexpected("a bench token is in range"))?;
            for (v, ops) in variants.iter_mut().enumerate() {
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(io)?;
                let resource = format!("bench-{n}-{i}-{v}");
                ops.push(match v {
                    0 => plain(conn, key.clone()),
                    1 => fenced(conn, functions.clone(), resource, key.clone(), base, false),
                    2 => fenced(conn, functions.clone(), resource, key.clone(), base, true),
                    _ => fenced(conn, eval.clone(), resource, key.clone(), base, false),
                });
            }
        }
        eprintln!("fence-redis: {n} clients");
        let run = interleave(variants, rounds, secs).await?;
        for (v, s) in run.merged.iter().enumerate() {
            table.row(vec![
                n.to_string(),
                VARIANTS[v].to_owned(),
                f(s.rate(), 0),
                f(s.ms(0.5), 3),
                f(s.ms(0.99), 3),
                ratio(run.ratio(v, 0)),
                TARGETS[v].to_owned(),
            ]);
        }
    }
    let mut tables = vec![table];
    if cpu_writes > 0 {
        let mut cpu = Table::new(
            format!(
                "Redis 7: server time per write (INFO commandstats usec_per_call of the command sent, which includes the commands a function runs), {cpu_writes} writes per variant from one client"
            ),
            &["variant", "command", "server µs/write", "vs plain SET"],
        );
        let mut base = None;
        for (v, name) in VARIANTS.iter().enumerate() {
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(io)?;
            let base_token = FencingToken::from_parts(epoch, Revision::new(1))
                .map_err(|_| BenchError::Unexpected("a bench token is in range"))?;
            let (key, resource) = ("{bench-cpu}:v".to_owned(), format!("bench-cpu-{v}"));
            let mut op = match v {
                0 => plain(conn, key),
                1 => fenced(conn, functions.clone(), resource, key, base_token, false),
                2 => fenced(conn, functions.clone(), resource, key, base_token, true),
                _ => fenced(conn, eval.clone(), resource, key, base_token, false),
            };
            op().await?;
            redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async::<()>(&mut setup)
                .await
                .map_err(io)?;
            for _ in 0..cpu_writes {
                op().await?;
            }
            let us = usec_per_call(&mut setup, COMMANDS[v]).await?;
            let base = *base.get_or_insert(us);
            cpu.row(vec![
                (*name).to_owned(),
                COMMANDS[v].to_uppercase(),
                f(us, 2),
                ratio(us / base.max(f64::MIN_POSITIVE)),
            ]);
        }
        tables.push(cpu);
    }
    drop(server);
    Ok(tables)
}

/// `usec_per_call` of `command` in `INFO commandstats`.
async fn usec_per_call(conn: &mut MultiplexedConnection, command: &str) -> Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(io)?;
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|us| us.parse().ok())
        .ok_or(BenchError::Unexpected(
            "INFO commandstats has no usec_per_call for the bench's command",
        ))
}

/// `SET key VALUE`.
fn plain(conn: MultiplexedConnection, key: String) -> Op {
    let key = Arc::new(key);
    Box::new(move || {
        let (mut conn, key) = (conn.clone(), Arc::clone(&key));
        Box::pin(async move {
            redis::cmd("SET")
                .arg(&*key)
                .arg(VALUE)
                .query_async::<()>(&mut conn)
                .await
                .map_err(io)
        })
    })
}

/// `fenced_set` of `key` under `resource`'s mark: always `base`, or `base` plus one more
/// each write (`rising`).
fn fenced(
    conn: MultiplexedConnection,
    fence: RedisFence,
    resource: String,
    key: String,
    base: FencingToken,
    rising: bool,
) -> Op {
    let shared = Arc::new((fence, resource, key));
    let next = Arc::new(AtomicU64::new(base.get()));
    Box::new(move || {
        let (mut conn, shared, next) = (conn.clone(), Arc::clone(&shared), Arc::clone(&next));
        Box::pin(async move {
            let raw = if rising {
                next.fetch_add(1, Ordering::Relaxed)
            } else {
                next.load(Ordering::Relaxed)
            };
            let token = FencingToken::from_u64(raw)
                .map_err(|_| BenchError::Unexpected("a bench token left the token range"))?;
            let (fence, resource, key) = &*shared;
            fence
                .set(&mut conn, resource, token, key.as_str(), VALUE)
                .await
                .map_err(fence_error)
        })
    })
}
