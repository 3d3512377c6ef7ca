//! `palisade chaos`: the fault-injection run (and, hidden, one worker of it).

use std::path::PathBuf;
use std::time::Duration;

use palisade_chaos::{RunOptions, WorkerConfig};

use super::exit::{CliError, Exit};

/// Flags of `palisade chaos`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ChaosArgs {
    #[command(subcommand)]
    command: Option<ChaosCommand>,
    /// Seeds the fault schedule and the workers' choices (same seed, same schedule).
    #[arg(long, required = true)]
    seed: Option<u64>,
    /// How long the workers work, e.g. `60s` or `10m`. The first round of faults (one of
    /// each kind) always completes, so a run lasts at least about a minute.
    #[arg(long, required = true, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Worker processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Lock keys the workers share (fewer keys, more contention).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    keys: u32,
    /// Where to write the history (JSON lines); default: a file named after the seed in
    /// the temp directory.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Run every part on loopback instead of on network hosts of its own (which need
    /// root: CAP_NET_ADMIN and CAP_SYS_ADMIN); the network faults are not planned then.
    #[arg(long)]
    loopback: bool,
}

#[derive(Debug, clap::Subcommand)]
enum ChaosCommand {
    /// Check a saved history (JSON lines) and print the checker's report; fails on any
    /// violation, and on a history with no entries (exit 2).
    Check {
        /// The history file.
        history: PathBuf,
    },
    /// One worker of a run, started by the run itself.
    #[command(hide = true)]
    Worker {
        /// The worker's configuration, as JSON.
        #[arg(long)]
        config: String,
    },
}

/// Why a `palisade chaos` run failed (exit 1).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChaosCliError {
    #[error("{0} violation(s) (see the report above)")]
    Violations(usize),
    #[error("the history was not checked")]
    NotChecked,
    #[error("the run is incomplete: a worker exited early or the audit tailer did not catch up (see the summary)")]
    Incomplete,
}

/// Runs a worker (hidden subcommand), checks a saved history, or runs the harness. A run
/// prints its summary; it fails when the checker found a violation, or the run was
/// incomplete. A run that SIGINT or SIGTERM interrupts removes what it started and exits
/// 130 or 143 (see `palisade_chaos::Interrupt`).
pub(crate) fn run(args: ChaosArgs) -> Result<String, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match args.command {
        Some(ChaosCommand::Worker { config }) => {
            let config: WorkerConfig = serde_json::from_str(&config).map_err(|e| {
                CliError::bad_input(format!("the worker configuration is not valid JSON: {e}"))
            })?;
            runtime.block_on(palisade_chaos::run_worker(config))?;
            return Ok(String::new());
        }
        Some(ChaosCommand::Check { history }) => {
            let file = std::fs::File::open(&history).map_err(|e| {
                std::io::Error::new(e.kind(), format!("reading {}: {e}", history.display()))
            })?;
            let report = palisade_chaos::check::check_reader(std::io::BufReader::new(file))?;
            if report.counts.entries == 0 {
                return Err(CliError::bad_input(format!(
                    "{} holds no history entries: nothing to check",
                    history.display()
                ))
                .into());
            }
            super::output::emit(&report.to_string())?;
            return match report.violations.len() {
                0 => Ok(String::new()),
                n => Err(ChaosCliError::Violations(n).into()),
            };
        }
        None => {}
    }
    let (Some(seed), Some(duration)) = (args.seed, args.duration) else {
        return Err(CliError::bad_input("--seed and --duration are required").into());
    };
    let history = args.history.unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "palisade-chaos-{seed}-{}.jsonl",
            std::process::id()
        ))
    });
    let exe = std::env::current_exe()?;
    let run = runtime.block_on(palisade_chaos::run(RunOptions {
        seed,
        duration,
        workers: args.workers,
        keys: args.keys,
        history,
        exe,
        loopback: args.loopback,
    }));
    let summary = match run {
        Ok(summary) => summary,
        Err(e @ palisade_chaos::ChaosError::Interrupted { signal, .. }) => {
            let exit = match signal {
                palisade_chaos::Interrupt::Sigint => Exit::Interrupted,
                palisade_chaos::Interrupt::Sigterm => Exit::Terminated,
            };
            return Err(CliError::new(exit, e.to_string()).into());
        }
        Err(e) => return Err(e.into()),
    };
    super::output::emit(&summary.to_string())?;
    match &summary.violations {
        Some(v) if !v.is_empty() => Err(ChaosCliError::Violations(v.len()).into()),
        None => Err(ChaosCliError::NotChecked.into()),
        Some(_) if !summary.passed() => Err(ChaosCliError::Incomplete.into()),
        Some(_) => Ok(String::new()),
    }
}
