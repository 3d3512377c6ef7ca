//! `palisade lock ...`: acquire, release, status, and run a command under a lock.
//!
//! `lock acquire` keeps nothing running: it opens a session (an etcd lease of `--ttl`
//! seconds), takes the lock on it (renewing the session while it waits, so a wait may
//! outlast the TTL), prints the hold as JSON and exits. The hold lasts
//! until `lock release`, `session close`, or the session's lease lapses: renew it with
//! `session keepalive` more often than once per TTL to keep the lock longer.

use palisade_api::wire::{AcquireBody, ReleaseBody};
use palisade_api::ProblemKind;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use palisade_client::ClientErrorKind;
use palisade_lock::{Enforcement, HolderMeta, Mode};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

use super::connect::{block_on, Connection};
use super::exit::{CliError, Exit, Result};

/// `palisade lock` and the connection flags of its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct LockArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: LockCommand,
}

/// Lock subcommands.
#[derive(Debug, clap::Subcommand)]
enum LockCommand {
    /// Take a lock and print the hold as JSON; nothing keeps running.
    ///
    /// Prints the hold as a JSON object with `session`, `namespace`, `class`, `key`,
    /// `mode`, `token`, `grant_rev`, `enforcement`, `ttl_ms`, `holder_meta` (if given)
    /// and `own_session`: the handle that `lock release --hold` takes. Without `session keepalive SESSION` (more often than the TTL) the hold
    /// ends when its session's TTL lapses. Exits 75 if others held the lock for the
    /// whole wait, 130 if interrupted (Ctrl-C) while waiting; either way the session
    /// opened for it is closed again. While it waits it renews the session it opened
    /// (every third of the TTL), so `--wait-ms` may be longer than `--ttl`. Exits 74 if
    /// the acquire got no answer within --wait-ms plus --timeout-ms (the lock may have
    /// been granted; a session it opened is no longer renewed, so the hold would end
    /// with its TTL).
    Acquire {
        /// The lock: namespace/class/key (the key may contain `/`).
        lock: String,
        /// TTL of the new session, in whole seconds, at least 1 (the class bounds it).
        /// The session is opened on the etcd cluster tier where the namespace lives.
        #[arg(long, default_value_t = 30, conflicts_with = "session", value_parser = super::args::ttl_secs)]
        ttl: u64,
        /// Take the lock on this existing session (from `session open` or an earlier
        /// acquire) instead of opening one; `lock release` then leaves it open.
        #[arg(long)]
        session: Option<String>,
        /// How long to wait for the lock, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        wait_ms: u64,
        /// Take the lock shared instead of exclusive.
        #[arg(long)]
        shared: bool,
        /// A JSON object stored with the hold and listed by `lock status` (host, job
        /// id...), at most 1024 bytes as compact JSON.
        #[arg(long, value_name = "JSON")]
        holder_meta: Option<String>,
    },
    /// Release a hold taken by `lock acquire`.
    ///
    /// Takes the JSON that `lock acquire` printed (`--hold FILE`, `-` for stdin), or
    /// NS/CLASS/KEY with `--session` and `--grant-rev`. A session that `lock acquire`
    /// opened for the hold is closed with it. Exits 76 if the hold had already ended, 74
    /// if the release got no definite answer (sent again for 10 s, or --timeout-ms if
    /// shorter; the session close after it gets at most one more second).
    Release {
        /// The lock: namespace/class/key (with --session and --grant-rev).
        #[arg(required_unless_present = "hold", conflicts_with = "hold", requires_all = ["session", "grant_rev"])]
        lock: Option<String>,
        /// A file holding what `lock acquire` printed; `-` reads stdin.
        #[arg(long)]
        hold: Option<PathBuf>,
        /// The session that holds the lock.
        #[arg(long)]
        session: Option<String>,
        /// The hold's grant revision.
        #[arg(long)]
        grant_rev: Option<u64>,
        /// The hold is shared.
        #[arg(long)]
        shared: bool,
        /// Also close the session (every other hold of it ends too).
        #[arg(long)]
        close_session: bool,
    },
    /// Print a lock's holders (with tokens), waiters in order, and class, as JSON. Exits
    /// 1 without an answer within --timeout-ms.
    ///
    /// `foreign_keys` lists keys under the lock that no live session owns, each with the
    /// etcd lease it is on (`0000000000000000`: none, as a copy made with `etcdctl
    /// make-mirror` leaves them). They are neither holders nor waiters; the next acquire
    /// of the lock deletes the holds and waiters among them.
    Status {
        /// The lock: namespace/class/key.
        lock: String,
    },
    /// Run a command while holding a lock, with its token in FENCING_TOKEN.
    ///
    /// The session is renewed while the command runs; the command is killed (SIGKILL)
    /// if the hold is lost. Exits with the command's exit code, 75 if the lock was not
    /// acquired within the wait, 76 if the hold was lost or the session ended while it
    /// waited, 74 if the acquire got no answer within --wait-ms plus --timeout-ms (other
    /// failures before the command starts: the codes of `palisade --help`).
    Run(super::run::RunArgs),
}

/// Splits `ns/class/key`.
pub(crate) fn split_lock(lock: &str) -> std::result::Result<(&str, &str, &str), CliError> {
    let mut parts = lock.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(ns), Some(class), Some(key)) if !ns.is_empty() && !class.is_empty() => {
            Ok((ns, class, key))
        }
        _ => Err(CliError::bad_input(format!(
            "{lock:?} is not NAMESPACE/CLASS/KEY"
        ))),
    }
}

/// Percent-encodes a path segment or query value.
pub(crate) fn enc(v: &str) -> String {
    percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// What `lock acquire` prints and `lock release --hold` reads.
#[derive(Debug, Serialize, Deserialize)]
struct HoldFile {
    session: String,
    namespace: String,
    class: String,
    key: String,
    mode: Mode,
    /// Decimal string; `null` for an unprotected grant.
    token: Option<String>,
    grant_rev: Option<u64>,
    /// `fenced` or `advisory`: whether resources refuse writes without a current token.
    #[serde(default)]
    enforcement: Option<Enforcement>,
    /// The session's TTL: renew it (`session keepalive`) within this to keep the hold.
    #[serde(default)]
    ttl_ms: Option<u64>,
    /// What `--holder-meta` stored with the hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder_meta: Option<HolderMeta>,
    /// Whether `lock acquire` opened the session for this hold (release closes it).
    #[serde(default)]
    own_session: bool,
}

fn mode(shared: bool) -> Mode {
    if shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}

pub(crate) fn run(args: LockArgs) -> Result<String> {
    let LockArgs { conn, cmd } = args;
    match cmd {
        LockCommand::Acquire {
            lock,
            ttl,
            session,
            wait_ms,
            shared,
            holder_meta,
        } => {
            let meta = holder_meta.as_deref().map(parse_meta).transpose()?;
            acquire(&conn, &lock, ttl, session, wait_ms, mode(shared), meta)
        }
        LockCommand::Release {
            lock,
            hold,
            session,
            grant_rev,
            shared,
            close_session,
        } => {
            let mut h = match (lock, hold) {
                (_, Some(path)) => read_hold(&path)?,
                (Some(lock), None) => {
                    let (ns, class, key) = split_lock(&lock)?;
                    HoldFile {
                        session: session.unwrap_or_default(),
                        namespace: ns.into(),
                        class: class.into(),
                        key: key.into(),
                        mode: mode(shared),
                        token: None,
                        grant_rev,
                        enforcement: None,
                        ttl_ms: None,
                        holder_meta: None,
                        own_session: false,
                    }
                }
                (None, None) => unreachable!("clap requires LOCK or --hold"),
            };
            h.own_session |= close_session;
            release(&conn, &h)
        }
        LockCommand::Status { lock } => {
            let (ns, class, key) = split_lock(&lock)?;
            let path = format!(
                "/v1/locks/status?namespace={}&class={}&key={}",
                enc(ns),
                enc(class),
                enc(key)
            );
            call(&conn, "GET", path, None)
        }
        LockCommand::Run(args) => super::run::run(&conn, args),
    }
}

/// One API call, bounded by `--timeout-ms`; the answer as pretty JSON (empty for 204).
pub(crate) fn call(
    conn: &Connection,
    method: &str,
    path: String,
    body: Option<serde_json::Value>,
) -> Result<String> {
    let client = conn.client()?;
    let what = format!("{method} {}", path.split('?').next().unwrap_or_default());
    let value = conn.block_on(&what, async move {
        Ok(client.call_json(method, &path, body).await?)
    })?;
    if value.is_null() {
        return Ok(String::new());
    }
    Ok(serde_json::to_string_pretty(&value)?)
}

/// Renews the session `lock acquire` opened for itself (`ttl_ms`: its granted TTL;
/// `None` for a session the caller passed, which the caller renews) every third of its
/// TTL while the acquire waits, so a wait longer than the TTL does not end it. Ends
/// only when the service says the session is gone: the wait cannot succeed then.
/// Once granted, renewing is the caller's (`session keepalive`).
async fn keep_alive_while_waiting(
    client: &palisade_client::Client,
    session: &str,
    ttl_ms: Option<u64>,
) -> Box<dyn std::error::Error> {
    let Some(ttl_ms) = ttl_ms else {
        return std::future::pending().await;
    };
    let every = Duration::from_millis((ttl_ms / 3).max(100));
    let path = format!("/v1/sessions/{}/keepalive", enc(session));
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = client.call_json("POST", &path, None).await {
            if e.is_session_lost() {
                return CliError::new(
                    Exit::Lost,
                    format!("the session opened for this acquire ended while it waited ({e})"),
                )
                .into();
            }
        }
    }
}

/// Exit 74: the acquire got no answer by the deadline, so the lock may have been granted.
fn no_grant_answer(conn: &Connection, session: &str, own: bool) -> CliError {
    let then = if own {
        "its session is no longer renewed, so such a hold ends when the session's TTL lapses"
    } else {
        "close that session (or let its TTL lapse) to end such a hold"
    };
    CliError::new(
        Exit::OutcomeUnknown,
        format!(
            "the acquire got no answer from the lock service at {} within --wait-ms and \
             --timeout-ms ({} ms); its outcome is unknown: the lock may have been granted to \
             session {session}; {then}",
            conn.service(),
            conn.timeout().as_millis()
        ),
    )
}

/// Parses `--holder-meta`: a JSON object of at most 1024 bytes.
pub(crate) fn parse_meta(text: &str) -> std::result::Result<HolderMeta, CliError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| CliError::bad_input(format!("--holder-meta is not JSON: {e}")))?;
    HolderMeta::from_value(value).map_err(|e| CliError::bad_input(format!("--holder-meta: {e}")))
}

fn acquire(
    conn: &Connection,
    lock: &str,
    ttl: u64,
    session: Option<String>,
    wait_ms: u64,
    mode: Mode,
    holder_meta: Option<HolderMeta>,
) -> Result<String> {
    let (ns, class, key) = split_lock(lock)?;
    let client = conn.client()?;
    // The whole command, the wait included, ends by this deadline.
    let wait = Duration::from_millis(wait_ms);
    let deadline = Instant::now() + wait + conn.timeout();
    let hold = block_on(async move {
        let (session, ttl_ms, own) = match session {
            Some(s) => (s, None, false),
            None => {
                let ttl_ms = ttl
                    .checked_mul(1000)
                    .ok_or_else(|| CliError::bad_input(format!("--ttl {ttl} is too large")))?;
                // A 503 `quorum-lost` is sent again within the wait, as the acquire is.
                let opening = client.call_json_within(
                    "POST",
                    "/v1/sessions",
                    // On the tier where the namespace lives (no quota slot).
                    Some(json!({ "ttl_ms": ttl_ms, "tier_of": ns })),
                    wait,
                );
                // Nothing was asked of the lock yet: a session whose answer is lost
                // ends with its lease, since nothing renews it.
                let opened = tokio::time::timeout_at(deadline, opening)
                    .await
                    .map_err(|_| conn.no_answer("opening a session for the acquire"))??;
                let id = opened["session"].as_str().ok_or_else(|| {
                    CliError::new(Exit::Failure, "the service opened a session without an id")
                })?;
                (id.to_owned(), opened["ttl_ms"].as_u64(), true)
            }
        };
        let body = AcquireBody {
            session: session.clone(),
            namespace: ns.to_owned(),
            class: class.to_owned(),
            key: key.to_owned(),
            mode,
            wait_ms,
            holder_meta: holder_meta.as_ref().map(|m| m.as_map().clone()),
            // One attempt, picked by the client: a retry after a lost answer is the same.
            attempt: None,
            replaces: None,
        };
        // SIGINT and SIGTERM (a supervisor's stop) end the wait the same way: the
        // session opened for it is closed below, so nothing is left held or counted.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let renewing = keep_alive_while_waiting(&client, &session, ttl_ms.filter(|_| own));
        let granted = tokio::select! {
            // A 503 `quorum-lost` is sent again within the wait (the client's policy).
            r = client.acquire(&body) => r.map_err(Into::into),
            e = renewing => Err(e),
            () = tokio::time::sleep_until(deadline) => Err(no_grant_answer(conn, &session, own).into()),
            _ = tokio::signal::ctrl_c() => Err(CliError::new(
                Exit::Interrupted,
                "interrupted (SIGINT) while waiting for the lock",
            )
            .into()),
            _ = term.recv() => Err(CliError::new(
                Exit::Terminated,
                "terminated (SIGTERM) while waiting for the lock",
            )
            .into()),
        };
        match granted {
            Ok(granted) => {
                let mut hold: HoldFile = serde_json::from_value(serde_json::to_value(granted)?)?;
                // What release needs to know besides the service's answer.
                hold.ttl_ms = ttl_ms;
                hold.own_session = own;
                hold.holder_meta = holder_meta;
                Ok(hold)
            }
            Err(e) => {
                if own {
                    // Leave nothing behind: the session was opened for this hold only
                    // (closing it also ends a wait that was interrupted). Within the
                    // deadline: past it, the session is no longer renewed and ends with
                    // its lease.
                    let path = format!("/v1/sessions/{}", enc(&session));
                    let closing = client.call_json("DELETE", &path, None);
                    let _ = tokio::time::timeout_at(deadline, closing).await;
                }
                Err(e)
            }
        }
    })?;
    let text = serde_json::to_string_pretty(&hold)?;
    if let Err(e) = super::output::emit(&text) {
        // Nobody received the hold: end it now rather than leave it held until its TTL.
        let undone = match hold.grant_rev {
            Some(_) => release(conn, &hold).map(drop),
            None if hold.own_session => {
                let path = format!("/v1/sessions/{}", enc(&hold.session));
                call(conn, "DELETE", path, None).map(drop)
            }
            None => Err(CliError::new(
                Exit::Failure,
                "an unprotected grant on a session this command did not open: close that session to end it",
            )
            .into()),
        };
        let what = match undone {
            Ok(()) => "released it".to_owned(),
            Err(u) => format!("releasing it failed too: {u}"),
        };
        return Err(CliError::new(
            Exit::Failure,
            format!("cannot write the hold to stdout ({e}); {what}"),
        )
        .into());
    }
    Ok(String::new())
}

fn read_hold(path: &std::path::Path) -> Result<HoldFile> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(path).map_err(|e| {
            CliError::bad_input(format!("cannot read the hold file {}: {e}", path.display()))
        })?
    };
    serde_json::from_str(&text).map_err(|e| {
        CliError::bad_input(format!(
            "{} is not a hold printed by `lock acquire`: {e}",
            path.display()
        ))
        .into()
    })
}

/// How long `lock release` sends a release whose answer is lost (exit 74 after it), if
/// `--timeout-ms` is longer.
const RELEASE_BUDGET: Duration = Duration::from_secs(10);

/// How long the session close after a release with an unknown outcome may take: the
/// service did not answer the release, so the close is one last try.
const LAST_CLOSE: Duration = Duration::from_secs(1);

fn release(conn: &Connection, h: &HoldFile) -> Result<String> {
    let Some(grant_rev) = h.grant_rev else {
        return Err(CliError::bad_input(
            "the hold has no grant revision (an unprotected grant): close its session instead",
        )
        .into());
    };
    let client = conn.client()?;
    // The release, and the close of its session, end by this deadline.
    let deadline = Instant::now() + conn.timeout();
    block_on(async move {
        let body = ReleaseBody {
            session: h.session.clone(),
            namespace: h.namespace.clone(),
            class: h.class.clone(),
            key: h.key.clone(),
            mode: h.mode,
            grant_rev: palisade_api::Revision::new(grant_rev),
        };
        // Sent again while the answer is lost, until a definite one or the budget ends.
        let budget = RELEASE_BUDGET.min(conn.timeout());
        let released = match client.release(&body, budget).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_outcome_unknown() => Err(CliError::new(
                Exit::OutcomeUnknown,
                format!(
                    "{e}; the hold may still be held: run the same release again, or let its session's TTL lapse"
                ),
            )
            .into()),
            Err(e)
                if e.is_not_held()
                    || e.is_hold_forced()
                    || e.kind() == &ClientErrorKind::Problem(ProblemKind::SessionLost) =>
            {
                Err(CliError::new(
                    Exit::Lost,
                    format!(
                        "the session holds no {}/{}/{} granted at revision {grant_rev}: the \
                         hold already ended, or that is not its grant revision ({})",
                        h.namespace,
                        h.class,
                        h.key,
                        e.detail()
                    ),
                )
                .into())
            }
            Err(e) if e.kind() == &ClientErrorKind::Problem(ProblemKind::NotFound) => {
                // No live session, or no such namespace? Ask the session itself (one
                // renewal if it lives).
                let path = format!("/v1/sessions/{}/keepalive", enc(&h.session));
                let asked = tokio::time::timeout_at(deadline, client.call_json("POST", &path, None));
                match asked.await {
                    Ok(Err(p)) if p.is_session_lost() => Err(CliError::new(
                        Exit::Lost,
                        format!(
                            "the hold already ended: its session is gone ({})",
                            e.detail()
                        ),
                    )
                    .into()),
                    _ => Err(Box::<dyn std::error::Error>::from(e)),
                }
            }
            Err(e) => Err(e.into()),
        };
        if h.own_session {
            let path = format!("/v1/sessions/{}", enc(&h.session));
            let until = match &released {
                Err(e) if Exit::of(&**e) == Exit::OutcomeUnknown => {
                    deadline.min(Instant::now() + LAST_CLOSE)
                }
                _ => deadline,
            };
            match tokio::time::timeout_at(until, client.call_json("DELETE", &path, None)).await {
                Ok(Err(e)) if !e.is_session_lost() && released.is_ok() => return Err(e.into()),
                Err(_) if released.is_ok() => {
                    return Err(CliError::new(
                        Exit::Failure,
                        format!(
                            "released; closing its session {} got no answer from the lock \
                             service at {} within --timeout-ms ({} ms): the session ends when \
                             its TTL lapses",
                            h.session,
                            conn.service(),
                            conn.timeout().as_millis()
                        ),
                    )
                    .into())
                }
                _ => {}
            }
        }
        released.map(|()| String::new())
    })
}
