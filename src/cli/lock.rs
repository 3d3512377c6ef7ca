//! `palisade lock ...`: hold locks through a running lock service.

use std::process::Stdio;
use std::time::Duration;

use palisade_lock::client::Client;
use palisade_lock::Mode;

/// Where the service is and who is calling (plain HTTP, dev mode).
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    /// Lock service URL (plain HTTP, dev mode).
    #[arg(long)]
    service: String,
    /// The SPIFFE ID to act as (dev mode's identity header).
    #[arg(long)]
    dev_identity: String,
}

/// Lock subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum LockCommand {
    /// Print a lock's holders (with tokens), waiters in order, and class, as JSON.
    Status {
        /// The lock: namespace/class/key.
        lock: String,
        #[command(flatten)]
        target: Target,
    },
    /// Administer namespaces, classes and the epoch (prints the service's JSON answer).
    #[command(subcommand)]
    Admin(AdminCommand),
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

/// Admin subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum AdminCommand {
    /// List namespaces (those the caller administers).
    Namespaces {
        #[command(flatten)]
        target: Target,
    },
    /// Create or update a namespace.
    PutNamespace {
        /// Namespace name.
        ns: String,
        /// Owning tenant.
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        target: Target,
    },
    /// List a namespace's classes.
    Classes {
        /// Namespace name.
        ns: String,
        #[command(flatten)]
        target: Target,
    },
    /// Create or update a class (exclusive, fenced, fail-closed unless told otherwise).
    PutClass {
        /// Namespace name.
        ns: String,
        /// Class name.
        class: String,
        /// Key prefix of the class.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Longest session TTL, in milliseconds.
        #[arg(long)]
        ttl_max_ms: Option<u64>,
        /// Allow shared holds.
        #[arg(long)]
        shared: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Show the epoch record.
    Epoch {
        #[command(flatten)]
        target: Target,
    },
    /// Advance the epoch (after a restore from snapshot, or a rehome).
    AdvanceEpoch {
        /// `restore` or `rehome`.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        target: Target,
    },
}

fn split_lock(lock: &str) -> Result<(&str, &str, &str), String> {
    let mut parts = lock.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(ns), Some(class), Some(key)) => Ok((ns, class, key)),
        _ => Err(format!("{lock:?} is not NS/CLASS/KEY")),
    }
}

fn call(
    target: Target,
    method: &str,
    path: String,
    body: Option<serde_json::Value>,
) -> Result<String, Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Runtime::new()?;
    let value = rt.block_on(async move {
        let client = Client::new(target.service)?.with_dev_identity(target.dev_identity);
        client.call_json(method, &path, body).await
    })?;
    Ok(serde_json::to_string_pretty(&value)?)
}

/// Percent-encodes a query value (everything but unreserved characters).
fn query_value(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn run(cmd: LockCommand) -> Result<String, Box<dyn std::error::Error>> {
    use serde_json::json;
    let run = match cmd {
        LockCommand::Status { lock, target } => {
            let (ns, class, key) = split_lock(&lock)?;
            let path = format!(
                "/v1/locks/status?namespace={}&class={}&key={}",
                query_value(ns),
                query_value(class),
                query_value(key)
            );
            return call(target, "GET", path, None);
        }
        LockCommand::Admin(admin) => {
            return match admin {
                AdminCommand::Namespaces { target } => {
                    call(target, "GET", "/v1/namespaces".into(), None)
                }
                AdminCommand::PutNamespace { ns, tenant, target } => call(
                    target,
                    "PUT",
                    format!("/v1/namespaces/{}", query_value(&ns)),
                    Some(json!({ "tenant_id": tenant })),
                ),
                AdminCommand::Classes { ns, target } => call(
                    target,
                    "GET",
                    format!("/v1/namespaces/{}/classes", query_value(&ns)),
                    None,
                ),
                AdminCommand::PutClass {
                    ns,
                    class,
                    prefix,
                    ttl_max_ms,
                    shared,
                    target,
                } => {
                    let mut body = json!({ "key_prefix": prefix });
                    if let Some(t) = ttl_max_ms {
                        body["ttl_max_ms"] = json!(t);
                    }
                    if shared {
                        body["mode"] = json!("shared");
                    }
                    call(
                        target,
                        "PUT",
                        format!(
                            "/v1/namespaces/{}/classes/{}",
                            query_value(&ns),
                            query_value(&class)
                        ),
                        Some(body),
                    )
                }
                AdminCommand::Epoch { target } => call(target, "GET", "/v1/epoch".into(), None),
                AdminCommand::AdvanceEpoch { reason, target } => call(
                    target,
                    "POST",
                    "/v1/epoch/advance".into(),
                    Some(json!({ "reason": reason })),
                ),
            };
        }
        LockCommand::Run {
            lock,
            service,
            dev_identity,
            ttl,
            wait_ms,
            shared,
            command,
        } => (
            lock,
            Target {
                service,
                dev_identity,
            },
            ttl,
            wait_ms,
            shared,
            command,
        ),
    };
    run_locked(run)
}

/// `lock run`: exits the process with the command's exit code (or 75 / 76).
fn run_locked(
    (lock, target, ttl, wait_ms, shared, command): (String, Target, u64, u64, bool, Vec<String>),
) -> Result<String, Box<dyn std::error::Error>> {
    let Target {
        service,
        dev_identity,
    } = target;
    let (ns, class, key) = split_lock(&lock)?;
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
