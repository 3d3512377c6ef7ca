//! `palisade`: the command-line front end of the Palisade lock service.

mod audit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
use palisade_fence::{Epoch, FencingToken, Revision};

/// Palisade: a distributed lock service on etcd with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "palisade", version, about)]
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
    /// Hold locks through a running lock service.
    #[command(subcommand)]
    Lock(cli::lock::LockCommand),
    /// Fault injection: real etcd, replicas, Postgres and workers under a seeded nemesis.
    Chaos(cli::chaos::ChaosArgs),
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
        /// Epoch, below 2^15.
        #[arg(long)]
        epoch: u16,
        /// etcd revision of the granting transaction, below 2^48.
        #[arg(long)]
        revision: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(out) => {
            if !out.is_empty() {
                println!("{out}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("palisade: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<String, Box<dyn std::error::Error>> {
    match cli.command {
        Command::Token(TokenCommand::Inspect { token }) => {
            let t: FencingToken = token.parse()?;
            Ok(format!(
                "token {t}\nepoch {}\nrevision {}",
                t.epoch(),
                t.revision()
            ))
        }
        Command::Token(TokenCommand::Compose { epoch, revision }) => {
            let t = FencingToken::from_parts(Epoch::new(epoch)?, Revision::new(revision))?;
            Ok(t.to_string())
        }
        Command::Audit(command) => audit::run(command),
        Command::Serve(args) => cli::serve::run(args),
        Command::Lock(cmd) => cli::lock::run(cmd),
        Command::Chaos(args) => cli::chaos::run(args),
    }
}
