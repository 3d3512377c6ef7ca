//! `palisade force-release ...`: the two-person force release of a lock key.
//!
//! An admin of the namespace (or of the service) requests it with a reason; a *different*
//! admin approves it by the request id; only then are the holds the request named
//! deleted. The requester approving their
//! own request is refused (403, exit 7); a second approval is exit 4.

use serde_json::json;

use super::connect::Connection;
use super::exit::Result;
use super::lock::{call, enc, split_lock};

/// `palisade force-release` and the connection flags of its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct ForceArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: ForceCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ForceCommand {
    /// Request the force release of NS/CLASS/KEY; prints the request with its `id`.
    /// Nothing is deleted until another admin approves.
    /// The request is about the holds of the key now (printed as its `targets`), or the
    /// one named by --grant-rev or --token; a hold granted later is never released by it.
    Request {
        /// The lock: namespace/class/key.
        lock: String,
        /// Why (1 to 1024 bytes); kept in the audit trail.
        #[arg(long)]
        reason: String,
        /// Only the hold granted at this revision (as `lock status` lists it).
        #[arg(long)]
        grant_rev: Option<u64>,
        /// Only the hold with this fencing token.
        #[arg(long)]
        token: Option<u64>,
    },
    /// Approve a request made by another admin: deletes the holds the request named that
    /// are still held and prints what was released (session, token, grant revision,
    /// revision of the deleting Txn); exit 4 (`force-target-gone`) if none is left.
    Approve {
        /// The request id that `force-release request` printed.
        id: String,
    },
}

pub(crate) fn run(args: ForceArgs) -> Result<String> {
    let ForceArgs { conn, cmd } = args;
    match cmd {
        ForceCommand::Request {
            lock,
            reason,
            grant_rev,
            token,
        } => {
            let (ns, class, key) = split_lock(&lock)?;
            let mut body = json!({ "namespace": ns, "class": class, "key": key, "reason": reason });
            if let Some(r) = grant_rev {
                body["grant_rev"] = json!(r);
            }
            if let Some(t) = token {
                body["token"] = json!(t.to_string());
            }
            call(&conn, "POST", "/v1/force-releases".into(), Some(body))
        }
        ForceCommand::Approve { id } => call(
            &conn,
            "POST",
            format!("/v1/force-releases/{}/approve", enc(&id)),
            None,
        ),
    }
}
