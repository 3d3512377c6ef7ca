//! `palisade`: the command-line front end of the Palisade lock service.
//!
//! Exit codes: the table in `cli/exit.rs` (also in `palisade --help`).

mod audit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
use palisade_fence::{Epoch, FencingToken, Revision};

/// Palisade: a distributed lock service on etcd with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "palisade", version, about, after_help = cli::exit::help())]
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
