//! `palisade epoch ...`: show the epoch record, advance it after a restore or rehome.

use serde_json::json;

use super::connect::Connection;
use super::exit::Result;
use super::lock::call;

/// `palisade epoch` and the connection flags of its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct EpochArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: EpochCommand,
}

#[derive(Debug, clap::Subcommand)]
enum EpochCommand {
    /// Print the epoch record, and why grants are refused if they are (service admins).
    ///
    /// `minted_rev` is the highest grant revision the answering replica minted a token
    /// for; `highest_grant_rev` is the highest the durable record has confirmed, which
    /// lags the tokens handed out (by up to the reservation window). Every token of the
    /// epoch is at most `epoch * 2^48 + reserved_rev`. Each etcd cluster tier keeps its
    /// own epoch record.
    Show {
        /// The tier whose record to show (default: the home tier).
        #[arg(long)]
        tier: Option<String>,
    },
    /// Advance the epoch after etcd was restored from a snapshot or the service was
    /// rehomed to another etcd cluster; prints the new record (service admins).
    Advance {
        /// Why.
        #[arg(long, value_enum)]
        reason: Reason,
        /// The etcd cluster tier whose epoch advances (default: the home tier). The new
        /// epoch is above every tier's.
        #[arg(long)]
        tier: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Reason {
    /// etcd was restored from a snapshot: revisions may go backwards.
    Restore,
    /// The namespace moved to another etcd cluster: another revision counter.
    Rehome,
}

pub(crate) fn run(args: EpochArgs) -> Result<String> {
    let EpochArgs { conn, cmd } = args;
    match cmd {
        EpochCommand::Show { tier } => {
            let path = match tier {
                Some(t) => {
                    super::args::check_name("tier", &t)?;
                    format!("/v1/epoch?tier={}", super::lock::enc(&t))
                }
                None => "/v1/epoch".into(),
            };
            call(&conn, "GET", path, None)
        }
        EpochCommand::Advance { reason, tier } => {
            let reason = match reason {
                Reason::Restore => "restore",
                Reason::Rehome => "rehome",
            };
            call(
                &conn,
                "POST",
                "/v1/epoch/advance".into(),
                Some(match tier {
                    Some(t) => json!({ "reason": reason, "tier": t }),
                    None => json!({ "reason": reason }),
                }),
            )
        }
    }
}
