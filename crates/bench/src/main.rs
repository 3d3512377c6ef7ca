//! `palisade-bench`: Palisade's comparisons, each run side by side in one process.
//!
//! Every subcommand builds the real parts it needs (a fresh PostgreSQL database, etcd
//! members in temporary directories, HTTP servers on loopback), runs the variants of its
//! comparison in turns (A, B, C, A, B, C... for `--rounds` rounds of `--secs` each, so
//! that they share the machine's noise), and prints a Markdown table to stdout: rates,
//! latency quantiles and the ratio of each variant to the comparison's base. Progress
//! goes to stderr. `BENCHMARKS.md` at the repository root records the tables.

mod audit;
mod drive;
mod error;
mod etcd_ops;
mod http;
mod lock;
mod memory;
mod mysql;
mod pg;
mod proxy;
mod redis;
mod report;
mod service;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Palisade benchmarks: A/B comparisons run in turns, printed as Markdown tables.
#[derive(Debug, Parser)]
#[command(name = "palisade-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How long each variant runs per round, and how many rounds.
#[derive(Debug, Clone, Args)]
struct Timing {
    /// Seconds each variant runs per round.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Rounds (each variant runs once per round, in turn).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

impl Timing {
    fn secs(&self) -> Duration {
        Duration::from_secs_f64(self.secs.max(0.001))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Postgres: plain UPDATE vs fenced_transaction vs fenced_execute vs FencedUpdate.
    Pg {
        /// Client counts (one connection each).
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        clients: Vec<usize>,
        /// Rows in the table (and fenced resources).
        #[arg(long, default_value_t = 10_000)]
        rows: i64,
        /// `synchronous_commit` of the bench's sessions (`on`: every commit waits for
        /// its WAL flush; `off`: CPU and round trips are the cost).
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        synchronous_commit: String,
        /// Writes each client makes to one row under one token before it moves to its
        /// next row with a new token (1: every fenced write raises the mark).
        #[arg(long, value_delimiter = ',', default_value = "1")]
        writes_per_token: Vec<usize>,
        /// Writes per variant for the server-CPU table (one client); 0 skips it.
        #[arg(long, default_value_t = 3_000)]
        cpu_writes: usize,
        #[command(flatten)]
        timing: Timing,
    },
    /// The fence layer: axum bare vs FenceLayer with MemoryStore and with PostgresStore.
    FenceLayer {
        /// Keep-alive HTTP/1.1 connections (one worker each).
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Resources each connection writes in turn.
        #[arg(long, default_value_t = 16)]
        resources: usize,
        /// Connections in the pooled PostgresStore's pool.
        #[arg(long, default_value_t = 4)]
        pg_pool: usize,
        #[command(flatten)]
        timing: Timing,
    },
    /// The fencing proxy (MemoryStore, PostgresStore) vs nginx vs the upstream direct.
    FenceProxy {
        /// Keep-alive HTTP/1.1 connections (one worker each).
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Resources each connection writes in turn.
        #[arg(long, default_value_t = 16)]
        resources: usize,
        #[command(flatten)]
        timing: Timing,
    },
    /// Redis: fenced_set (FCALL of the palisade_fence library) vs plain SET.
    FenceRedis {
        /// Client counts (one connection each).
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        clients: Vec<usize>,
        /// Writes per variant for the server-time table (one client); 0 skips it.
        #[arg(long, default_value_t = 20_000)]
        cpu_writes: usize,
        #[command(flatten)]
        timing: Timing,
    },
    /// MariaDB: FencedUpdate (folded) vs plain UPDATE; fence_raise in a transaction vs without.
    FenceMysql {
        /// Client counts (one connection each).
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        clients: Vec<usize>,
        /// Rows in the table (and fenced resources).
        #[arg(long, default_value_t = 10_000)]
        rows: i64,
        #[command(flatten)]
        timing: Timing,
    },
    /// MemoryStore: bytes per resource and ns per raise at N resources.
    MemoryStore {
        /// Resources inserted.
        #[arg(long, default_value_t = 1_000_000)]
        resources: usize,
        /// Raises timed per kind (equal, newer, older token).
        #[arg(long, default_value_t = 1_000_000)]
        ops: usize,
        /// Internal: measure one structure in this (child) process and print its bytes.
        #[arg(long, hide = true)]
        child: Option<usize>,
    },
    /// Audit: the unprotected-writes page and its JSON with N write events stored.
    Audit {
        /// Write events inserted before measuring.
        #[arg(long, default_value_t = 1_000_000)]
        events: usize,
        /// Fetches of each URL.
        #[arg(long, default_value_t = 200)]
        requests: usize,
    },
    /// The lock service over HTTP with mTLS vs the core in process: added acquire latency.
    Service {
        /// Client counts (one session and one mTLS connection each).
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        clients: Vec<usize>,
        #[command(flatten)]
        timing: Timing,
    },
    /// Lock cycle: Palisade core vs etcd v3lock vs the mutex recipe, and the raw Txn rate.
    Lock {
        /// etcd cluster sizes (each started fresh).
        #[arg(long, value_delimiter = ',', default_value = "1,3")]
        members: Vec<usize>,
        /// Client counts (one session or lease each).
        #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
        clients: Vec<usize>,
        /// Lock names the clients pick from at random.
        #[arg(long, value_delimiter = ',', default_value = "1,1000")]
        keys: Vec<usize>,
        /// Holds kept on other keys while measuring (scaling); each level adds holds.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        held: Vec<usize>,
        #[command(flatten)]
        timing: Timing,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("palisade-bench: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("palisade-bench: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> error::Result<()> {
    match command {
        Command::Pg {
            clients,
            rows,
            synchronous_commit,
            writes_per_token,
            cpu_writes,
            timing,
        } => {
            let args = pg::PgArgs {
                clients,
                rows,
                secs: timing.secs(),
                rounds: timing.rounds,
                synchronous_commit: synchronous_commit == "on",
                writes_per_token,
                cpu_writes,
            };
            for table in pg::run(&args).await? {
                table.print();
            }
        }
        Command::FenceLayer {
            connections,
            resources,
            pg_pool,
            timing,
        } => {
            let args = http::HttpArgs {
                connections,
                resources_per_connection: resources,
                pg_pool,
                secs: timing.secs(),
                rounds: timing.rounds,
            };
            http::run(&args).await?.print();
        }
        Command::FenceProxy {
            connections,
            resources,
            timing,
        } => proxy::run(connections, resources, timing.secs(), timing.rounds)
            .await?
            .print(),
        Command::FenceRedis {
            clients,
            cpu_writes,
            timing,
        } => {
            for table in redis::run(&clients, timing.secs(), timing.rounds, cpu_writes).await? {
                table.print();
            }
        }
        Command::FenceMysql {
            clients,
            rows,
            timing,
        } => {
            let args = mysql::MysqlArgs {
                clients,
                rows,
                secs: timing.secs(),
                rounds: timing.rounds,
            };
            mysql::run(&args).await?.print();
        }
        Command::Service { clients, timing } => {
            for table in service::run(&clients, timing.secs(), timing.rounds).await? {
                table.print();
            }
        }
        Command::Audit { events, requests } => audit::run(events.max(1), requests).await?.print(),
        Command::Lock {
            members,
            clients,
            keys,
            held,
            timing,
        } => {
            let mut held = held;
            held.sort_unstable();
            let args = lock::LockArgs {
                members,
                clients,
                keys,
                held,
                secs: timing.secs(),
                rounds: timing.rounds,
            };
            lock::run(&args).await?.print();
        }
        Command::MemoryStore {
            resources,
            ops,
            child,
        } => {
            let resources = resources.max(1);
            match child {
                Some(which) => memory::child(which, resources)?,
                None => {
                    let (footprint, cost) =
                        tokio::task::spawn_blocking(move || memory::run(resources, ops.max(1)))
                            .await
                            .map_err(|_| {
                                error::BenchError::Unexpected("the memory bench panicked")
                            })??;
                    footprint.print();
                    cost.print();
                }
            }
        }
    }
    Ok(())
}
