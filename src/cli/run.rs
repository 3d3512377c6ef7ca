//! `palisade lock run NS/CLASS/KEY -- COMMAND...`: a command under a lock, as
//! `consul lock` and flock(1) run one.

use std::process::Stdio;
use std::time::Duration;

use palisade_lock::Mode;

use super::connect::{block_on, Connection};
use super::exit::{CliError, Exit, Result};
use super::lock::split_lock;

/// Flags of `lock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The lock: namespace/class/key (the key may contain `/`).
    lock: String,
    /// Session TTL in whole seconds; the session is renewed every third of it while the
    /// command runs.
    #[arg(long, default_value_t = 10)]
    ttl: u64,
    /// How long to wait for the lock, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
    /// Take the lock shared instead of exclusive.
    #[arg(long)]
    shared: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Exits the process with the command's exit code, 75 (not acquired) or 76 (lost).
pub(crate) fn run(conn: &Connection, args: RunArgs) -> Result<String> {
    let RunArgs {
        lock,
        ttl,
        wait_ms,
        shared,
        command,
    } = args;
    let (ns, class, key) = split_lock(&lock)?;
    let client = conn.client()?;
    let code = block_on(async move {
        let session = client.open_session(Duration::from_secs(ttl)).await?;
        let mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        let hold = match session
            .acquire(ns, class, key, mode, Duration::from_millis(wait_ms))
            .await
        {
            Ok(h) => h,
            Err(e) => {
                let _ = session.close().await;
                let exit = Exit::of_client(&e);
                return Err(CliError::new(exit, format!("lock not acquired: {e}")).into());
            }
        };
        let token = hold.token().map(|t| t.to_string()).unwrap_or_default();
        let spawned = tokio::process::Command::new(&command[0])
            .args(&command[1..])
            .env("FENCING_TOKEN", &token)
            .stdin(Stdio::inherit())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = hold.release().await;
                let _ = session.close().await;
                return Err(
                    CliError::bad_input(format!("cannot run {:?}: {e}", command[0])).into(),
                );
            }
        };
        let code = tokio::select! {
            status = child.wait() => status?.code().unwrap_or(1),
            () = hold.lost() => {
                eprintln!("palisade: the hold was lost; killing the command");
                child.kill().await?;
                i32::from(Exit::Lost.code())
            }
        };
        if code != i32::from(Exit::Lost.code()) || !session.is_lost() {
            if let Err(e) = hold.release().await {
                eprintln!("palisade: release failed: {e}");
            }
        }
        let _ = session.close().await;
        Ok(code)
    })?;
    std::process::exit(code)
}
