//! The history of a chaos run: one [`Entry`] per line of a JSON-lines file.
//!
//! Every entry carries `at_ns`, nanoseconds since the run started on a monotonic clock
//! (`std::time::Instant`), and the process (`worker`) that recorded it. Entries of one worker
//! are in the order that worker observed them; entries of different workers are ordered only
//! by `at_ns`, which is good for reading a timeline, not for deciding safety. Safety is decided
//! from the orders the real parts define: etcd revisions within an epoch for holds, the
//! resource's own commit order for writes.
//!
//! Tokens are the raw `u64` of a fencing token (`epoch · 2^48 + revision`, see the design's
//! token rule); `None` means the write carried no token.

use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

/// A lock's full name: namespace, class and key, as the service names them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LockName {
    /// Namespace.
    pub ns: String,
    /// Lock class.
    pub class: String,
    /// Key within the class.
    pub key: String,
}

/// Which resource a write went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// A Postgres row, written through the fence's conditional-write helper.
    Postgres,
    /// An HTTP resource behind the fence's tower layer.
    Http,
}

/// What became of a write attempt, as the writer saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum WriteOutcome {
    /// The resource admitted and committed the write. `seq` is the resource's own commit
    /// order (for Postgres the row's version after the write; for HTTP the service's commit
    /// counter), so committed writes of one resource can be ordered without clocks.
    Committed {
        /// The resource's commit sequence number after this write.
        seq: u64,
    },
    /// The resource refused the token as stale; `highest` is the high-water mark it reported.
    Rejected {
        /// The resource's high-water mark at the time of the refusal, when it said.
        highest: Option<u64>,
    },
    /// The writer does not know (timeout, connection lost mid-commit).
    Indeterminate {
        /// What went wrong, for the reader.
        reason: String,
    },
}

/// How a hold ended in etcd, as etcd's history shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldEnd {
    /// The holder released it.
    Released,
    /// Its lease expired.
    Expired,
    /// An admin forced it.
    Forced,
    /// Still held when the history was read.
    Open,
}

/// One kind of fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Kill the etcd leader, then restart it.
    KillEtcdLeader,
    /// SIGSTOP an etcd member, then SIGCONT it.
    PauseEtcdMember,
    /// Kill a lock-service replica, then start it again.
    KillServiceReplica,
    /// Pause a worker past its session's TTL.
    PauseWorker,
    /// Restart Postgres.
    RestartPostgres,
    /// Restore etcd from a snapshot and advance the epoch.
    RestoreEtcdAndAdvanceEpoch,
    /// One admin requests a force release of a lock a worker holds; a second admin
    /// approves it a moment later, racing the worker's own release and re-acquire.
    ForceRelease,
    /// A worker's loopback proxy to the lock service loses its releases' requests or
    /// answers for a while.
    LoseReleaseAnswers,
    /// Move the workers' namespace to the other etcd cluster tier (and back on the next
    /// occurrence), through a replica's admin API.
    RehomeNamespace,
    /// Network hosts only: every host into one of two random halves, cut both ways.
    PartitionHalves,
    /// Network hosts only: the etcd leader cut off from every other host.
    IsolateEtcdLeader,
    /// Network hosts only: etcd's majority cut from its minority, one lock-service
    /// replica on each side.
    SplitMajorityMinority,
    /// Network hosts only: one worker cut off from etcd and the lock service (but not
    /// from the resource or PostgreSQL) past its TTL: the stale writer.
    CutWorkerFromLockService,
    /// Network hosts only: what one host sends to another is dropped, not the reverse.
    DropOneWay,
    /// Network hosts only: a share of one host's packets dropped at random (iptables).
    RandomLoss,
    /// Network hosts only, with a kernel that has netem: latency, jitter and loss on one
    /// host's link (`tc netem`).
    NetemLatency,
    /// Network hosts only: the wall clocks of a replica and a worker jump, one forward
    /// and one back (libfaketime); monotonic clocks stay true.
    ClockJump,
}

/// Why a worker's client said its hold was lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// The session ended (expired, closed, or not renewed for a whole TTL).
    SessionEnded,
    /// The hold was force-released: told by the session's keepalive (`request_id` known)
    /// or by the answer to a release (`hold-forced`).
    Forced {
        /// The force release request that ended it, when the client was told.
        request_id: Option<String>,
    },
    /// A release was answered `not-held`: the hold had ended otherwise.
    NotHeld,
}

/// Which race on one session a worker ran (see [`Event::SessionRace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RaceKind {
    /// The acquire's connection was reset while the service still worked on it (the
    /// worker's proxy reset the client's side only), and the worker sent it again on the
    /// same session: two attempts of one acquire in the service at once.
    ResetRetry,
    /// Two tasks of the worker acquired one lock on one session at once (each recorded
    /// its own `acquire_invoked`, and its grant or failure); the second task releases
    /// what it is granted at once.
    SharedSession,
}

/// What an approval of a force release answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ForceOutcome {
    /// 200: these holds (by grant revision) were deleted.
    Released {
        /// The grant revisions of the holds the approval says it deleted.
        grant_revs: Vec<i64>,
    },
    /// 409 `force-target-gone`: every hold the request named was gone; nothing deleted.
    TargetGone,
    /// No definite answer (or another error): the approval may or may not have run.
    Unknown {
        /// What went wrong, for the reader.
        reason: String,
    },
}

/// What a rehome's request answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RehomeOutcome {
    /// 200: the namespace lives on `to` now, under this epoch (above every tier's).
    Moved {
        /// The epoch `to` serves the namespace under.
        epoch: u16,
    },
    /// 503 `namespace-moving`: the drain did not finish in time (or the new tier could
    /// not be prepared) and the move was rolled back; the namespace stays on `from`.
    RolledBack {
        /// The service's detail.
        reason: String,
    },
}

/// Whether a fault entry marks its start or its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The fault was injected.
    Start,
    /// The fault was healed.
    End,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A worker asked for a lock.
    AcquireInvoked {
        /// The lock.
        lock: LockName,
    },
    /// A worker was granted the lock with this token.
    Granted {
        /// The lock.
        lock: LockName,
        /// The fencing token handed out.
        token: u64,
        /// The session (etcd lease id) that holds it.
        session: i64,
        /// The etcd revision of the granting transaction.
        grant_rev: i64,
        /// The tier whose etcd granted it (the session's); absent for the home tier.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
    },
    /// A worker ran a race on its session ([`RaceKind`]): recorded when a reset acquire
    /// is sent again, or before the two racing `acquire_invoked`. Only with the run's
    /// session races on (`PALISADE_CHAOS_RACES=on`).
    SessionRace {
        /// The lock.
        lock: LockName,
        /// Which race.
        race: RaceKind,
    },
    /// An acquire failed or timed out.
    AcquireFailed {
        /// The lock.
        lock: LockName,
        /// The error, for the reader.
        error: String,
    },
    /// A worker is about to write to a resource.
    WriteInvoked {
        /// The resource (row id or HTTP path).
        resource: String,
        /// Where it went.
        target: Target,
        /// The token it carried, if any.
        token: Option<u64>,
        /// Unique per attempt within the run; ties the invocation to its outcome.
        op: u64,
    },
    /// The outcome of the write with the same `op`.
    WriteCompleted {
        /// The resource.
        resource: String,
        /// Where it went.
        target: Target,
        /// The token it carried, if any.
        token: Option<u64>,
        /// The attempt it completes.
        op: u64,
        /// What became of it.
        #[serde(flatten)]
        outcome: WriteOutcome,
    },
    /// A worker released its hold.
    Released {
        /// The lock.
        lock: LockName,
        /// The token of the hold it released.
        token: u64,
        /// The etcd revision of the releasing transaction, when known.
        release_rev: Option<i64>,
    },
    /// A worker's client signalled that the hold was lost (session expired or revoked,
    /// hold forced, or a release answered that it was gone).
    Lost {
        /// The lock.
        lock: LockName,
        /// The token of the hold it lost.
        token: u64,
        /// Why, as the client said; absent in histories written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<LossReason>,
    },
    /// A worker's release got no definite answer within its budget (outcome unknown): the
    /// client goes on sending it in the background while the session lives, and the
    /// worker goes on using the session.
    ReleaseUnknown {
        /// The lock.
        lock: LockName,
        /// The token of the hold it released.
        token: u64,
    },
    /// A worker gave its hold up without a definite end (its release failed otherwise, or
    /// its acquire got no answer): it writes no more with the token and closes the
    /// session, whose expiry ends the hold.
    Abandoned {
        /// The lock.
        lock: LockName,
        /// The token of the hold it gave up.
        token: u64,
    },
    /// A worker's session was renewed: the renewal (or, the first time, the open) sent
    /// at `sent_ns` (the history's clock) was acknowledged with `ttl_ms`, so the client
    /// counts the session alive until `sent_ns + ttl_ms` and must say it is lost soon
    /// after that if no later renewal succeeds.
    Renewed {
        /// The session (etcd lease id).
        session: i64,
        /// When the renewal was sent, nanoseconds on the history's clock.
        sent_ns: u64,
        /// The TTL the renewal counts from, milliseconds.
        ttl_ms: u64,
    },
    /// An admin requested a force release; the service answered with the holds it is
    /// about, fixed at request time.
    ForceRequested {
        /// The lock.
        lock: LockName,
        /// The request's id (the force marker in etcd names it).
        request_id: String,
        /// The grant revisions of the request's targets.
        targets: Vec<i64>,
    },
    /// A second admin approved a force release request; what the service answered.
    ForceApproved {
        /// The lock.
        lock: LockName,
        /// The request's id.
        request_id: String,
        /// The answer.
        #[serde(flatten)]
        outcome: ForceOutcome,
    },
    /// The nemesis injected or healed a fault.
    Fault {
        /// Which fault.
        kind: FaultKind,
        /// Start or end.
        phase: Phase,
        /// Which member, replica or worker, for the reader.
        detail: String,
        /// The worker a pause stops (the loss signal's deadline waits for it); absent
        /// for other faults.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paused_worker: Option<u32>,
    },
    /// The epoch of a tier was advanced (a restore, or a rehome to that tier): every
    /// later grant of that tier carries it or a later one. Epochs are one sequence across
    /// tiers, so each advance is above every earlier one.
    EpochAdvanced {
        /// The new epoch.
        epoch: u16,
        /// The tier it was advanced on; absent for the home tier.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
    },
    /// The nemesis moved the workers' namespace to another tier, or tried to.
    Rehome {
        /// The namespace.
        ns: String,
        /// The tier it lived on (the service's name of it).
        from: String,
        /// The tier it was moved to.
        to: String,
        /// What the service answered.
        #[serde(flatten)]
        outcome: RehomeOutcome,
    },
    /// The runner read one tier's etcd revision: a linearizable read sent at `asked_ns`
    /// was answered (this entry's `at_ns`) with `revision`. Every revision at or below it
    /// was committed before the answer, every one above it after the read was sent; so
    /// these entries order the revisions of different clusters in real time.
    RevisionSeen {
        /// The tier; absent for the home tier.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
        /// The tier's revision space (the home tier's changes with each restore).
        space: u32,
        /// The revision in the answer's header.
        revision: i64,
        /// When the read was sent, nanoseconds on the history's clock.
        asked_ns: u64,
    },
    /// A hold as etcd's history shows it, read after the run (one per hold key lifetime).
    EtcdHold {
        /// The lock.
        lock: LockName,
        /// The epoch the hold was granted in.
        epoch: u16,
        /// The hold key's create revision.
        grant_rev: i64,
        /// The revision of the delete that ended it; `None` when still open.
        end_rev: Option<i64>,
        /// Exclusive (`true`) or shared.
        exclusive: bool,
        /// How it ended.
        end: HoldEnd,
        /// The revision space it was granted in: 0 for the cluster the run started with,
        /// `n` for the cluster the `n`-th snapshot restore made (0 when absent).
        #[serde(default)]
        space: u32,
        /// The session (etcd lease id) the hold key names; absent in histories written
        /// before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<i64>,
        /// The tier whose etcd cluster held it (revisions and `space` are that
        /// cluster's); absent for the home tier.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
    },
    /// A hold that etcd's history shows force-released (its grant record rewritten to a
    /// force marker), read after the run: one per `etcd_hold` that ended `forced`.
    EtcdForced {
        /// The lock.
        lock: LockName,
        /// The epoch the hold was granted in.
        epoch: u16,
        /// The hold key's create revision.
        grant_rev: i64,
        /// The revision of the force Txn.
        end_rev: i64,
        /// The revision space.
        space: u32,
        /// The force release request the marker names.
        request_id: String,
    },
    /// A hold a snapshot restore brought back: its key was in the snapshot, so it is
    /// present again when the restored cluster starts, granted in an earlier epoch at a
    /// revision at or below the snapshot's. Read after the run from the restored
    /// cluster's history, one per hold key present at its start. (The hold's own grant,
    /// and how it ended in the cluster that granted it, is an [`Event::EtcdHold`] of an
    /// earlier space.)
    RestoredHold {
        /// The lock.
        lock: LockName,
        /// The epoch the hold was granted in (an earlier one than the space serves).
        epoch: u16,
        /// The hold key's create revision (at or below `restored_rev`).
        grant_rev: i64,
        /// The snapshot's revision: the restored cluster starts there, and every
        /// revision of its space is above it.
        restored_rev: i64,
        /// The revision space the restore made (1 for the first restore).
        space: u32,
        /// The revision of the delete that ended it in that space; `None` when still
        /// present when the space was read.
        end_rev: Option<i64>,
        /// Exclusive (`true`) or shared.
        exclusive: bool,
        /// How it ended in that space.
        end: HoldEnd,
    },
    /// How far the audit tailer had read a revision space when a snapshot restore
    /// destroyed it: it had stored the space's lock events through revision `through`.
    /// Events above it went with the cluster before the tailer could read them (the
    /// restored cluster never had them), so the audit trail may lack their rows.
    AuditCut {
        /// The revision space the restore destroyed.
        space: u32,
        /// The last revision of the space the tailer had stored.
        through: i64,
    },
    /// A row of the audit log, read after the run.
    AuditRow {
        /// `grant`, `release`, `expire`, `force` or `unprotected_write`.
        kind: String,
        /// The lock, for lock events.
        lock: Option<LockName>,
        /// The resource, for write events.
        resource: Option<String>,
        /// The token the row names, if any.
        token: Option<u64>,
        /// The etcd revision the row names, if any.
        revision: Option<i64>,
    },
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Nanoseconds since the run started (monotonic).
    pub at_ns: u64,
    /// The recording process: a worker's number, or `u32::MAX` for the nemesis and the runner.
    pub worker: u32,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// A history that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("reading the history: {0}")]
    Io(#[from] io::Error),
    /// A line is not an [`Entry`].
    #[error("history line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// Writes `entry` as one JSON line.
pub fn write_entry(mut out: impl Write, entry: &Entry) -> io::Result<()> {
    serde_json::to_writer(&mut out, entry)?;
    out.write_all(b"\n")
}

/// Reads a JSON-lines history; blank lines are skipped, any other bad line is an error.
pub fn read_history(input: impl BufRead) -> Result<Vec<Entry>, ReadError> {
    let mut entries = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let entry = serde_json::from_str(&line).map_err(|source| ReadError::Parse {
            line: i + 1,
            source,
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

/// Reads a JSON-lines history one entry at a time, without holding it in memory; blank
/// lines are skipped. After an error the iterator may go on with the next line.
///
/// # Errors
///
/// Each item is [`ReadError::Io`] if the input cannot be read, or [`ReadError::Parse`]
/// naming the 1-based line that is not an [`Entry`].
pub fn entries<R: BufRead>(input: R) -> Entries<R> {
    Entries {
        lines: input.lines(),
        line: 0,
    }
}

/// The iterator of [`entries`].
#[derive(Debug)]
pub struct Entries<R> {
    lines: io::Lines<R>,
    line: usize,
}

impl<R: BufRead> Iterator for Entries<R> {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let line = match self.lines.next()? {
                Ok(line) => line,
                Err(e) => return Some(Err(e.into())),
            };
            self.line += 1;
            if line.trim().is_empty() {
                continue;
            }
            let line_no = self.line;
            return Some(
                serde_json::from_str(&line).map_err(|source| ReadError::Parse {
                    line: line_no,
                    source,
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests;
