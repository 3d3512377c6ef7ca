//! `palisade`: the command-line front end of the Palisade lock service.
//!
//! Exit codes: see `cli/exit.rs` (also in `palisade --help`).

mod audit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
use palisade_fence::{Epoch, FencingToken, Revision};

/// Palisade: a distributed lock service on etcd with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "palisade", version, about, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with fencing tokens offline.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The audit trail: serve its dashboard, tail lock events from etcd.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Run the lock service.
    Serve(cli::serve::ServeArgs),
    /// Acquire, release, inspect locks, or run a command under one.
    Lock(cli::lock::LockArgs),
    /// Open, renew and close sessions (the etcd leases that holds live on).
    Session(cli::session::SessionArgs),
    /// Create, update and list namespaces.
    Namespace(cli::config::NamespaceArgs),
    /// Create, update and list lock classes.
    Class(cli::config::ClassArgs),
    /// Show or advance the epoch of fencing tokens.
    Epoch(cli::epoch::EpochArgs),
    /// Two-person force release of a lock key: one admin requests, another approves.
    ForceRelease(cli::force::ForceArgs),
    /// Fault injection: real etcd, replicas, Postgres and workers under a seeded nemesis.
    Chaos(cli::chaos::ChaosArgs),
    /// Show a resource's high-water mark, or reset a poisoned one (with a reason, audited).
    Fence(cli::fence::FenceArgs),
}

/// The exit codes, as `palisade --help` shows them.
const EXIT_CODES: &str = "\
Commands that talk to the lock service take --service URL and either --cert, --key and
--ca (mTLS; or PALISADE_SERVICE, PALISADE_CERT, PALISADE_KEY, PALISADE_CA) or
--dev-identity SPIFFE_ID (a service in dev mode; or PALISADE_DEV_IDENTITY).

Exit codes:
  0   done
  1   any other failure (service unreachable, or unable to serve now: quorum-lost,
      namespace-moving, shutting-down, epoch-mismatch, epoch-store-unavailable,
      upstream, internal; local I/O)
  2   bad input (usage, malformed argument or hold file, unusable certificates, invalid-input)
  3   not found (not-found: namespace, class, session, force release request)
  4   conflict (create of something that exists, already-approved, force-target-gone,
      epoch-exhausted, wrong-tier: the session is on another tier than the namespace)
  5   quota exceeded (quota-exceeded)
  6   unauthenticated (certificate refused or missing, 401 unauthenticated)
  7   forbidden (403 forbidden)
  74  outcome unknown: a release got no definite answer within 10 s of retries
  75  not acquired: others held the lock for the whole wait (deadline-exceeded)
  76  not held: the hold or its session is gone, or it was force-released (not-held,
      session-lost, hold-forced)
  130 interrupted (Ctrl-C) while lock acquire waited (its session is closed), or
      during a chaos run (what it started is removed)
  143 terminated (SIGTERM), as for 130
`lock run` exits with its command's code once the command ran.";

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Split a decimal token into its epoch and grant revision.
    Inspect {
        /// The token, as carried in the `Fencing-Token` header.
        token: String,
    },
    /// Compose a token from an epoch and an etcd revision.
    Compose {
        /// Epoch, from 0 to 32767 (below 2^15).
        #[arg(long, value_parser = clap::value_parser!(u16).range(0..=i64::from(Epoch::MAX.get())))]
        epoch: u16,
        /// etcd revision of the granting transaction, below 2^48.
        #[arg(long)]
        revision: u64,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go to stdout, usage errors to stderr (exit 2); a stdout that
        // cannot take the help is an error, as for every other command's output.
        Err(e) => {
            return match e.print() {
                Ok(()) => ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)),
                Err(io) => {
                    cli::output::warn(&format!("cannot write to stdout: {io}"));
                    ExitCode::from(cli::exit::Exit::Failure.code())
                }
            };
        }
    };
    let done = run(cli).and_then(|out| {
        if out.is_empty() {
            return Ok(());
        }
        cli::output::emit(&out).map_err(|e| {
            cli::exit::CliError::new(
                cli::exit::Exit::Failure,
                format!("cannot write to stdout: {e}"),
            )
            .into()
        })
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            cli::output::warn(&cli::exit::with_causes(&*e));
            ExitCode::from(cli::exit::Exit::of(&*e).code())
        }
    }
}

fn run(cli: Cli) -> Result<String, Box<dyn std::error::Error>> {
    use cli::exit::CliError;
    let bad = |e: &dyn std::fmt::Display| CliError::bad_input(e.to_string());
    match cli.command {
        Command::Token(TokenCommand::Inspect { token }) => {
            let t: FencingToken = token.parse().map_err(|e| bad(&e))?;
            Ok(format!(
                "token {t}\nepoch {}\nrevision {}",
                t.epoch(),
                t.revision()
            ))
        }
        Command::Token(TokenCommand::Compose { epoch, revision }) => {
            let epoch = Epoch::new(epoch).map_err(|e| bad(&e))?;
            let t =
                FencingToken::from_parts(epoch, Revision::new(revision)).map_err(|e| bad(&e))?;
            Ok(t.to_string())
        }
        Command::Audit(command) => audit::run(command),
        Command::Serve(args) => cli::serve::run(args),
        Command::Lock(args) => cli::lock::run(args),
        Command::Session(args) => cli::session::run(args),
        Command::Namespace(args) => cli::config::run_namespace(args),
        Command::Class(args) => cli::config::run_class(args),
        Command::Epoch(args) => cli::epoch::run(args),
        Command::ForceRelease(args) => cli::force::run(args),
        Command::Chaos(args) => cli::chaos::run(args),
        Command::Fence(args) => cli::fence::run(args),
    }
}
