//! `palisade session ...`: open, renew and close sessions (etcd leases) from a shell.
//!
//! A hold taken by `lock acquire` lives as long as its session: renew it with
//! `session keepalive` more often than its TTL (one call renews every hold of it), or
//! end it with `session close` (every hold ends).

use serde_json::json;

use super::connect::Connection;
use super::exit::{CliError, Exit, Result};
use super::lock::{call, enc};

/// `palisade session` and the connection flags of its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct SessionArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: SessionCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SessionCommand {
    /// Open a session; prints {"session","spiffe_id","ttl_ms","opened_rev","namespace","tier"}.
    Open {
        /// TTL in whole seconds, at least 1.
        #[arg(long, default_value_t = 30, value_parser = super::args::ttl_secs)]
        ttl: u64,
        /// The etcd cluster tier to open it on (default: the home tier, or the tier of
        /// --tier-of). A session acquires only locks of namespaces on its tier.
        #[arg(long)]
        tier: Option<String>,
        /// Open it on the tier where this namespace lives (takes no quota slot).
        #[arg(long, value_name = "NAMESPACE")]
        tier_of: Option<String>,
    },
    /// Renew a session once (every hold of it); prints {"ttl_ms"}. Exits 76 if the
    /// session is gone, 1 without an answer within --timeout-ms (renewed or not: try
    /// again within the TTL).
    Keepalive {
        /// The session id (16 hex digits).
        session: String,
    },
    /// Close a session: every hold of it ends. A session already gone is not an error.
    Close {
        /// The session id (16 hex digits).
        session: String,
    },
}

pub(crate) fn run(args: SessionArgs) -> Result<String> {
    let SessionArgs { conn, cmd } = args;
    match cmd {
        SessionCommand::Open { ttl, tier, tier_of } => {
            let ttl_ms = ttl
                .checked_mul(1000)
                .ok_or_else(|| CliError::bad_input(format!("--ttl {ttl} is too large")))?;
            let mut body = json!({ "ttl_ms": ttl_ms });
            if let Some(t) = tier {
                body["tier"] = t.into();
            }
            if let Some(ns) = tier_of {
                body["tier_of"] = ns.into();
            }
            call(&conn, "POST", "/v1/sessions".into(), Some(body))
        }
        SessionCommand::Keepalive { session } => {
            let path = format!("/v1/sessions/{}/keepalive", enc(&session));
            call(&conn, "POST", path, None).map_err(|e| gone(e, "keepalive"))
        }
        SessionCommand::Close { session } => {
            let path = format!("/v1/sessions/{}", enc(&session));
            match call(&conn, "DELETE", path, None) {
                Err(e) if Exit::of(&*e) == Exit::NotFound => Ok(String::new()),
                other => other,
            }
        }
    }
}

/// A session that is not found (expired, closed) is lost: exit 76.
fn gone(e: Box<dyn std::error::Error>, what: &str) -> Box<dyn std::error::Error> {
    if Exit::of(&*e) == Exit::NotFound {
        return CliError::new(Exit::Lost, format!("{what}: the session is gone ({e})")).into();
    }
    e
}
