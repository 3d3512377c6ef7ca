//! `palisade lock ...`: hold locks through a running lock service.

use std::process::Stdio;
use std::time::Duration;

use palisade_lock::client::Client;
use palisade_lock::Mode;

/// Lock subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum LockCommand {
    /// Run COMMAND while holding NS/CLASS/KEY. The token is in FENCING_TOKEN; the command
    /// is killed (SIGKILL) if the hold is lost. Exits with the command's exit code, 75 if
    /// the lock was not acquired, 76 if the hold was lost.
    Run {
        /// The lock: namespace/class/key (the key may contain `/`).
        lock: String,
        /// Lock service URL (plain HTTP, dev mode).
        #[arg(long)]
        service: String,
        /// The SPIFFE ID to act as (dev mode's identity header).
        #[arg(long)]
        dev_identity: String,
        /// Session TTL in whole seconds.
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
    },
}

pub(crate) fn run(cmd: LockCommand) -> Result<String, Box<dyn std::error::Error>> {
    let LockCommand::Run {
        lock,
        service,
        dev_identity,
        ttl,
        wait_ms,
        shared,
        command,
    } = cmd;
    let mut parts = lock.splitn(3, '/');
    let (Some(ns), Some(class), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("{lock:?} is not NS/CLASS/KEY").into());
    };
    let rt = tokio::runtime::Runtime::new()?;
    let code = rt.block_on(async move {
        let client = Client::new(service)?.with_dev_identity(dev_identity);
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
                eprintln!("palisade: lock not acquired: {e}");
                let _ = session.close().await;
                return Ok::<i32, Box<dyn std::error::Error>>(75);
            }
        };
        let token = hold.token().map(|t| t.to_string()).unwrap_or_default();
        let mut child = tokio::process::Command::new(&command[0])
            .args(&command[1..])
            .env("FENCING_TOKEN", &token)
            .stdin(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let code = tokio::select! {
            status = child.wait() => status?.code().unwrap_or(1),
            () = hold.lost() => {
                eprintln!("palisade: the hold was lost; killing the command");
                child.kill().await?;
                76
            }
        };
        if code != 76 {
            if let Err(e) = hold.release().await {
                eprintln!("palisade: release failed: {e}");
            }
        }
        let _ = session.close().await;
        Ok(code)
    })?;
    std::process::exit(code)
}
