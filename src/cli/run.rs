//! `palisade lock run NS/CLASS/KEY -- COMMAND...`: a command under a lock, as
//! `consul lock` and flock(1) run one, and as a supervisor (systemd, Kubernetes, a cron
//! wrapper) expects to stop one.
//!
//! Rules:
//! - The command runs in a process group of its own. SIGTERM, SIGINT and SIGHUP sent to
//!   `palisade` are forwarded to that group; if the command has not exited `--grace-ms`
//!   after the first of them, the group gets SIGKILL. Then the hold is released and
//!   `palisade` exits with the command's code, or 128 + the signal that ended it.
//! - A signal that arrives while the lock is still awaited ends the wait: the session is
//!   closed, `palisade` says which signal on stderr and exits with 128 + the signal.
//! - When the hold is lost the group gets SIGKILL at once and `palisade` exits 76. A
//!   session that ends while the lock is awaited (closed, expired, or unrenewed for a
//!   TTL because the service does not answer) is a loss too: exit 76, the command never
//!   runs.
//! - Every exchange with the service is bounded. Opening the session: `--timeout-ms`
//!   (exit 1 past it). The wait for the lock: `--wait-ms` plus `--timeout-ms` (exit 74
//!   past it, the outcome unknown). Release and close after the command, or a close
//!   after a signal: together by the TTL or `--timeout-ms`, whichever is shorter; a
//!   close after a loss: [`CLOSE_AFTER_LOSS`]. Past a bound the session's lease ends the
//!   hold anyway, since nothing renews it.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use palisade_lock::Mode;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use super::connect::{block_on, Connection};
use super::exit::{CliError, Exit, Result};
use super::lock::{parse_meta, split_lock};
use super::output::warn;

/// How long a session close may take once the hold is known lost: the lease is gone or
/// going, so the close is a courtesy.
const CLOSE_AFTER_LOSS: Duration = Duration::from_secs(1);

/// Flags of `lock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The lock: namespace/class/key (the key may contain `/`).
    lock: String,
    /// Session TTL in whole seconds (at least 1; the class bounds it); the session is
    /// renewed every third of it while the command runs.
    #[arg(long, default_value_t = 10, value_parser = super::args::ttl_secs)]
    ttl: u64,
    /// How long to wait for the lock, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    wait_ms: u64,
    /// After forwarding SIGTERM, SIGINT or SIGHUP to the command, how long to wait for it
    /// to exit before SIGKILL, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    grace_ms: u64,
    /// Take the lock shared instead of exclusive.
    #[arg(long)]
    shared: bool,
    /// A JSON object stored with the hold and listed by `lock status`, at most 1024
    /// bytes as compact JSON.
    #[arg(long, value_name = "JSON")]
    holder_meta: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The signals `lock run` forwards to its command.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: from here on these signals no longer end `palisade`.
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// Says on stderr that `sig` ended the wait for the lock (as `lock acquire` does), and
/// returns the exit code, 128 + the signal. A stderr that cannot be written is no error.
fn not_acquired(sig: Signal) -> i32 {
    use std::io::Write;
    let what = match sig {
        Signal::SIGINT => "interrupted (SIGINT)",
        Signal::SIGHUP => "hung up (SIGHUP)",
        _ => "terminated (SIGTERM)",
    };
    let _ = writeln!(
        std::io::stderr(),
        "palisade: {what} while waiting for the lock; the command did not run"
    );
    128 + sig as i32
}

/// Sends `sig` to every process of the group `pgid`; a group already gone is fine.
fn signal_group(pgid: Pid, sig: Signal) {
    match killpg(pgid, sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => warn(&format!("cannot send {sig} to the command: {e}")),
    }
}

/// The code a shell would report: the exit code, or 128 + the signal that ended it.
fn code_of(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Exits the process with the command's exit code (or 128 + signal), 75 (not acquired),
/// 76 (lost), or 128 + a signal received before the command started.
pub(crate) fn run(conn: &Connection, args: RunArgs) -> Result<String> {
    let RunArgs {
        lock,
        ttl,
        wait_ms,
        grace_ms,
        shared,
        holder_meta,
        command,
    } = args;
    let (ns, class, key) = split_lock(&lock)?;
    let meta = holder_meta.as_deref().map(parse_meta).transpose()?;
    let client = conn.client()?;
    let ttl = Duration::from_secs(ttl);
    let lock_env = lock.clone();
    // How long each exchange with the service may take, outside the wait for the lock
    // and the command's run: past it the session ends with its lease anyway.
    let bound = ttl.min(conn.timeout());
    let code = block_on(async move {
        let mut signals = Signals::install()?;
        let session = tokio::select! {
            // On the tier where the namespace lives.
            s = tokio::time::timeout(conn.timeout(), client.open_session_for(ns, ttl)) => {
                s.map_err(|_| conn.no_answer("opening a session for lock run"))??
            }
            sig = signals.recv() => return Ok(not_acquired(sig)),
        };
        let mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        let wait = Duration::from_millis(wait_ms);
        let deadline = Instant::now() + wait + conn.timeout();
        let waited = tokio::select! {
            r = session.acquire_with_meta(ns, class, key, mode, wait, meta.as_ref()) => Waited::Answer(r),
            // Its keepalive found it gone, or got no answer for a whole TTL.
            () = session.lost() => Waited::SessionLost,
            () = tokio::time::sleep_until(deadline) => Waited::NoAnswer,
            sig = signals.recv() => Waited::Signal(sig),
        };
        let hold = match waited {
            Waited::Answer(Ok(h)) => h,
            Waited::Answer(Err(e)) => {
                let lost = session_ended(&client, &session, &e, bound).await;
                let _ = tokio::time::timeout(bound, session.close()).await;
                if lost {
                    return Err(session_lost_while_waiting(&e.to_string()).into());
                }
                let exit = Exit::of_client(&e);
                return Err(CliError::new(exit, format!("lock not acquired: {e}")).into());
            }
            Waited::SessionLost => {
                let _ = tokio::time::timeout(CLOSE_AFTER_LOSS, session.close()).await;
                return Err(session_lost_while_waiting(
                    "its keepalive found it gone, or got no answer within its TTL",
                )
                .into());
            }
            Waited::NoAnswer => {
                // The service may have granted it: the session is no longer renewed, so
                // such a hold ends with the session's lease.
                let _ = tokio::time::timeout(CLOSE_AFTER_LOSS, session.close()).await;
                return Err(CliError::new(
                    Exit::OutcomeUnknown,
                    format!(
                        "the acquire got no answer from the lock service at {} within --wait-ms \
                         and --timeout-ms ({} ms); its outcome is unknown: the session is no \
                         longer renewed, so a hold it may have got ends with its TTL; the \
                         command did not run",
                        conn.service(),
                        conn.timeout().as_millis()
                    ),
                )
                .into());
            }
            Waited::Signal(sig) => {
                // Closing the session also ends the wait on the service.
                let _ = tokio::time::timeout(bound, session.close()).await;
                return Ok(not_acquired(sig));
            }
        };
        let token = hold.token().map(|t| t.to_string()).unwrap_or_default();
        let grant_rev = hold.grant_rev().map(|r| r.to_string()).unwrap_or_default();
        let spawned = tokio::process::Command::new(&command[0])
            .args(&command[1..])
            .env("FENCING_TOKEN", &token)
            .env("PALISADE_LOCK", &lock_env)
            .env("PALISADE_SESSION", session.id())
            .env("PALISADE_GRANT_REV", &grant_rev)
            .stdin(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = tokio::time::timeout(bound, async {
                    let _ = hold.release().await;
                    let _ = session.close().await;
                })
                .await;
                return Err(
                    CliError::bad_input(format!("cannot run {:?}: {e}", command[0])).into(),
                );
            }
        };
        // The child leads its own group: its pid is the group id.
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let mut kill_at: Option<Instant> = None;
        let (mut signalled, mut lost) = (false, false);
        let status = loop {
            tokio::select! {
                status = child.wait() => break status?,
                sig = signals.recv() => {
                    if let Some(pgid) = pgid {
                        signal_group(pgid, sig);
                    }
                    if !signalled {
                        signalled = true;
                        kill_at = Some(Instant::now() + Duration::from_millis(grace_ms));
                    }
                }
                () = sleep_until(kill_at) => {
                    warn(&format!("the command outlived the {grace_ms} ms grace period; killing it"));
                    if let Some(pgid) = pgid {
                        signal_group(pgid, Signal::SIGKILL);
                    }
                    kill_at = None;
                }
                () = hold.lost(), if !lost => {
                    warn("the hold was lost; killing the command");
                    lost = true;
                    if let Some(pgid) = pgid {
                        signal_group(pgid, Signal::SIGKILL);
                    }
                }
            }
        };
        // Nothing of a stopped or cut-off job keeps running without the lock.
        if let (Some(pgid), true) = (pgid, lost || signalled) {
            signal_group(pgid, Signal::SIGKILL);
        }
        if lost || session.is_lost() {
            let _ = tokio::time::timeout(CLOSE_AFTER_LOSS, session.close()).await;
            return Ok(i32::from(Exit::Lost.code()));
        }
        let finished = tokio::time::timeout(bound, async {
            if let Err(e) = hold.release().await {
                warn(&format!("release failed: {e}"));
            }
            let _ = session.close().await;
        })
        .await;
        if finished.is_err() {
            warn(&format!(
                "the service did not answer the release within {} ms (the TTL or --timeout-ms); the hold ends with its session's lease",
                bound.as_millis()
            ));
        }
        Ok(code_of(status))
    })?;
    std::process::exit(code)
}

/// How the wait for the lock ended.
enum Waited {
    /// The service answered the acquire.
    Answer(std::result::Result<palisade_client::RemoteHold, palisade_client::ClientError>),
    /// The session ended first.
    SessionLost,
    /// No answer by the deadline.
    NoAnswer,
    /// A signal to stop.
    Signal(Signal),
}

/// Whether the acquire's failure `e` is the end of `session`: the service says so
/// (`session-lost`), or it answers `not-found` (which names no session, namespace or class
/// apart) and one renewal of the session, bounded by `bound`, finds it gone too.
async fn session_ended(
    client: &palisade_client::Client,
    session: &palisade_client::ClientSession,
    e: &palisade_client::ClientError,
    bound: Duration,
) -> bool {
    use palisade_api::ProblemKind;
    match e.problem() {
        Some(ProblemKind::SessionLost) => true,
        Some(ProblemKind::NotFound) => {
            if session.is_lost() {
                return true;
            }
            let path = palisade_api::routes::keepalive(session.id());
            let asked = tokio::time::timeout(bound, client.call_json("POST", &path, None)).await;
            matches!(asked, Ok(Err(k)) if k.is_session_lost())
        }
        _ => false,
    }
}

/// Exit 76: the session ended while `lock run` waited for the lock.
fn session_lost_while_waiting(why: &str) -> CliError {
    CliError::new(
        Exit::Lost,
        format!("the session ended while waiting for the lock ({why}); the command did not run"),
    )
}

/// Sleeps until `at`, forever if `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
