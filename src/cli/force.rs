//! `palisade force-release ...`: the two-person force release of a lock key.
//!
//! An admin of the namespace requests it with a reason; a *different* admin approves it
//! by the request id; only then are the holds deleted. The requester approving their
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
    Request {
        /// The lock: namespace/class/key.
        lock: String,
        /// Why (1 to 1024 bytes); kept in the audit trail.
        #[arg(long)]
        reason: String,
    },
    /// Approve a request made by another admin: deletes every hold of the key and prints
    /// what was released (session, token, revision of the deleting Txn).
    Approve {
        /// The request id that `force-release request` printed.
        id: String,
    },
}

pub(crate) fn run(args: ForceArgs) -> Result<String> {
    let ForceArgs { conn, cmd } = args;
    match cmd {
        ForceCommand::Request { lock, reason } => {
            let (ns, class, key) = split_lock(&lock)?;
            call(
                &conn,
                "POST",
                "/v1/force-releases".into(),
                Some(json!({ "namespace": ns, "class": class, "key": key, "reason": reason })),
            )
        }
        ForceCommand::Approve { id } => call(
            &conn,
            "POST",
            format!("/v1/force-releases/{}/approve", enc(&id)),
            None,
        ),
    }
}
