//! A worker: one process, one session at a time, a loop of acquire, fenced writes and
//! release, each step recorded as a history entry on stdout (one JSON line each).
//! The session is opened in the namespace, so on the tier the namespace lives on; when
//! an acquire answers `wrong-tier` (the namespace moved), the worker closes it and
//! opens another.
//!
//! It is its own process so that stopping it (SIGSTOP) also stops its session's
//! keepalive, as a garbage-collection pause or a frozen VM would. It stops writing with
//! a hold's token once it recorded the hold's loss signal (`RemoteHold::lost`, with its
//! reason); a write that was under way, or that a paused process sends before its
//! client's timer fires, is what the resources must refuse. It records each renewal its
//! client had acknowledged (`renewed`), so the checker can hold the signal to its
//! deadline. It reaches the replicas through loopback proxies of its own
//! ([`palisade_testkit::LossyProxy`]); after the line `lose-releases on` on its stdin,
//! and until `lose-releases off`, the proxy loses each release: in turn, every attempt
//! for 1 s (the outcome is then unknown and the client retries in the background while
//! the worker goes on with the session), the answer to the first attempt, or the first
//! attempt. After `pause-next-write` it stops itself (SIGSTOP) right after recording its
//! next write with a token, before sending it, until the nemesis continues it. It stops
//! after the cycle under way once its stdin closes. With the run's session races on
//! ([`WorkerConfig::races`]), some cycles send their acquire again after its connection
//! was reset while the service still worked on it, and some have a second task acquire
//! the same lock on the same session (`races.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use palisade_api::TieredSessionId;
use palisade_client::{Client, ClientSession, HoldLoss, ProblemKind, RemoteHold};
use palisade_fence::{FencingToken, FencingTokenLayer};
use palisade_testkit::{Loss, LossyProxy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tower::ServiceBuilder;

use crate::clock::RunClock;
use crate::error::ChaosError;
use crate::history::{write_entry, Entry, Event, LockName, LossReason, RaceKind};
use crate::resource::key_name;

mod races;
mod writes;

use races::{Acquired, Races};
use writes::{write_http, write_pg};

/// The namespace the workers lock in.
pub const NAMESPACE: &str = "chaos";
/// The (fenced, exclusive) lock class the workers lock in.
pub const CLASS: &str = "cells";
/// How long one acquire waits for the lock.
const ACQUIRE_WAIT: Duration = Duration::from_secs(3);
/// How long one HTTP write may take before it counts as indeterminate (and how long a
/// release may try).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a release whose every attempt is lost tries before its outcome is unknown.
const LOST_RELEASE_BUDGET: Duration = Duration::from_secs(1);
/// The line on a worker's stdin that makes its proxy lose its releases from then on.
pub(crate) const LOSE_RELEASES_ON: &str = "lose-releases on";
/// The line on a worker's stdin that ends [`LOSE_RELEASES_ON`].
pub(crate) const LOSE_RELEASES_OFF: &str = "lose-releases off";
/// The line on a worker's stdin that makes it stop itself (SIGSTOP, the whole process,
/// keepalive included) right after it records its next write with a token, before the
/// write is sent: a pause between deciding to write and writing. Armed for
/// [`PAUSE_ARMED_FOR`]; the nemesis continues it (SIGCONT).
pub(crate) const PAUSE_NEXT_WRITE: &str = "pause-next-write";
/// How long [`PAUSE_NEXT_WRITE`] stays armed.
pub(crate) const PAUSE_ARMED_FOR: Duration = Duration::from_secs(5);

/// What a worker process is told, as one JSON argument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// The worker's number (its `worker` in the history).
    pub id: u32,
    /// The run's seed; the worker's choices come from `seed` and `id`.
    pub seed: u64,
    /// The run's start on `CLOCK_MONOTONIC` ([`crate::clock::monotonic_ns`]).
    pub start_ns: u64,
    /// The lock-service replicas (`http://IP:PORT`, on their hosts' addresses or
    /// loopback); sessions go round-robin.
    pub services: Vec<String>,
    /// The HTTP resource service.
    pub resource_url: String,
    /// The resource database (libpq key/value form).
    pub database: String,
    /// Keys to lock: `key-0` .. `key-{keys-1}`.
    pub keys: u32,
    /// Session TTL, milliseconds.
    pub ttl_ms: u64,
    /// Whether the worker runs races on its session: an acquire whose connection is
    /// reset is sent again, and two tasks acquire one lock at once (see `races.rs`).
    #[serde(default)]
    pub races: bool,
}

/// Records entries on stdout.
#[derive(Clone)]
struct Recorder {
    clock: RunClock,
    /// Until when (`at_ns`) the next recorded write with a token stops the process; 0
    /// when not armed.
    pause_until: Arc<AtomicU64>,
    worker: u32,
}

impl Recorder {
    fn record(&self, event: Event) {
        let entry = Entry {
            at_ns: self.clock.at_ns(),
            worker: self.worker,
            event,
        };
        let mut out = std::io::stdout().lock();
        // A closed stdout means the runner is gone; nothing is left to record for.
        if write_entry(&mut out, &entry)
            .and_then(|()| std::io::Write::flush(&mut out))
            .is_err()
        {
            std::process::exit(0);
        }
    }

    /// Records `event` if the hold of `token` is still the worker's (its loss was not
    /// recorded meanwhile); says whether it did. The check and the record happen under
    /// `current`'s lock, as the loss is recorded, so a write is never recorded after the
    /// worker was told.
    fn record_if_held(&self, current: &Current, token: u64, event: Event) -> bool {
        {
            let cur = current.lock().unwrap_or_else(|e| e.into_inner());
            if cur.as_ref().is_none_or(|(_, _, t)| *t != token) {
                return false;
            }
            self.record(event);
        }
        if self.clock.at_ns() < self.pause_until.swap(0, Ordering::SeqCst) {
            // Stops every thread of the process until the nemesis continues it.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
        true
    }

    /// A `std::time::Instant` on the history's clock.
    fn ns_of(&self, at: std::time::Instant) -> u64 {
        let ago = std::time::Instant::now().saturating_duration_since(at);
        self.clock
            .at_ns()
            .saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// The hold a worker has, for the lost-signal watcher: (session id, lock, token).
type Current = Arc<Mutex<Option<(String, LockName, u64)>>>;

type TokenCell = Arc<Mutex<Option<FencingToken>>>;

/// Runs a worker until its stdin closes.
///
/// # Errors
///
/// [`ChaosError::InvalidOptions`] for a config without services or keys;
/// [`ChaosError::Audit`] if the database pool cannot be built.
pub async fn run_worker(config: WorkerConfig) -> Result<(), ChaosError> {
    if config.services.is_empty() || config.keys == 0 {
        return Err(ChaosError::InvalidOptions(
            "a worker needs at least one service and one key",
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let lossy = Arc::new(AtomicBool::new(false));
    let (stopping, arming) = (stop.clone(), lossy.clone());
    let clock = RunClock::from_start(config.start_ns);
    let pause_until = Arc::new(AtomicU64::new(0));
    let pausing = pause_until.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            match line.trim() {
                LOSE_RELEASES_ON => arming.store(true, Ordering::SeqCst),
                LOSE_RELEASES_OFF => arming.store(false, Ordering::SeqCst),
                PAUSE_NEXT_WRITE => {
                    let until = clock.at_ns() + PAUSE_ARMED_FOR.as_nanos() as u64;
                    pausing.store(until, Ordering::SeqCst);
                }
                _ => {}
            }
        }
        stopping.store(true, Ordering::SeqCst);
    });
    let rec = Recorder {
        clock,
        pause_until,
        worker: config.id,
    };
    let mut rng = StdRng::seed_from_u64(
        config.seed ^ (u64::from(config.id) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let mut racing = config.races.then(|| Races::new(config.seed, config.id));
    let identity = format!("spiffe://chaos/workers/w{}", config.id);
    // Each replica through a loopback proxy of this process, which loses releases while
    // the nemesis says so.
    let mut proxies = Vec::new();
    for url in &config.services {
        let upstream: SocketAddr = url
            .trim_start_matches("http://")
            .parse()
            .map_err(|_| ChaosError::InvalidOptions("a service is not http://IP:PORT"))?;
        proxies.push(LossyProxy::start(upstream).await);
    }
    let clients: Vec<Client> = proxies
        .iter()
        .map(|p| {
            Client::new(format!("http://{}", p.addr()))
                .map(|c| c.with_dev_identity(identity.clone()))
        })
        .collect::<Result<_, _>>()
        .map_err(ChaosError::service("building a lock-service client"))?;
    let pool = palisade_audit::pool(&config.database, 1)?;
    let token: TokenCell = Arc::default();
    let source = token.clone();
    let fenced_http = ServiceBuilder::new()
        .layer(FencingTokenLayer::new(move || {
            *source.lock().unwrap_or_else(|e| e.into_inner())
        }))
        .service(HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let plain_http = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let current: Current = Arc::default();
    let mut session: Option<ClientSession> = None;
    let mut opened = 0_usize;
    // The proxy the session's client goes through, and how many releases were lost.
    let mut proxy = 0_usize;
    let mut lost_releases = 0_u64;
    let mut op = u64::from(config.id) << 40;
    let ttl = Duration::from_millis(config.ttl_ms);

    while !stop.load(Ordering::SeqCst) {
        if session.as_ref().is_none_or(ClientSession::is_lost) {
            proxy = (config.id as usize + opened) % clients.len();
            let client = &clients[proxy];
            opened += 1;
            // Opened in the namespace: the service opens it on the tier the namespace
            // lives on.
            let open = client.open_session_in(NAMESPACE, ttl);
            match tokio::time::timeout(WRITE_TIMEOUT, open).await {
                Ok(Ok(s)) => {
                    watch_loss(&s, current.clone(), rec.clone());
                    record_renewals(&s, rec.clone());
                    session = Some(s);
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let Some(s) = session.clone() else { continue };
        let key = key_name(rng.gen_range(0..config.keys));
        let lock = LockName {
            ns: NAMESPACE.into(),
            class: CLASS.into(),
            key: key.clone(),
        };
        rec.record(Event::AcquireInvoked { lock: lock.clone() });
        let race = racing.as_mut().and_then(Races::pick);
        let mut second =
            (race == Some(RaceKind::SharedSession)).then(|| races::spawn_second(&rec, &s, &lock));
        let acquired = if race == Some(RaceKind::ResetRetry) {
            races::acquire_reset(&rec, &s, &proxies[proxy], &lock).await
        } else {
            races::acquire(&s, &lock, ACQUIRE_WAIT).await
        };
        let hold = match acquired {
            Acquired::Answered(Ok(hold)) => hold,
            Acquired::Answered(Err(e)) => {
                rec.record(Event::AcquireFailed {
                    lock,
                    error: e.to_string(),
                });
                if races::join(&mut second).await {
                    abandon(&rec, &mut session, &current).await;
                    continue;
                }
                if e.is_session_lost() {
                    session = None;
                } else if e.problem() == Some(ProblemKind::WrongTier) {
                    // The namespace moved to another tier: a session there is needed.
                    if let Some(s) = session.take() {
                        let _ = tokio::time::timeout(WRITE_TIMEOUT, s.close()).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(rng.gen_range(50..250))).await;
                continue;
            }
            Acquired::GiveUp(error) => {
                rec.record(Event::AcquireFailed { lock, error });
                races::join(&mut second).await;
                abandon(&rec, &mut session, &current).await;
                continue;
            }
        };
        let (Some(t), Some(rev)) = (hold.token(), hold.grant_rev()) else {
            rec.record(Event::AcquireFailed {
                lock,
                error: "granted without a fencing token".into(),
            });
            let _ = hold.release().await;
            if races::join(&mut second).await {
                abandon(&rec, &mut session, &current).await;
            }
            continue;
        };
        let (lease, tier) = session_of(&s);
        *current.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((s.id().to_owned(), lock.clone(), t.get()));
        *token.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        rec.record(Event::Granted {
            lock: lock.clone(),
            token: t.get(),
            session: lease,
            grant_rev: rev.as_i64(),
            tier,
        });

        // Rounds of writes with pauses between them: a pause here (SIGSTOP from the
        // nemesis, or the occasional long one here) is followed by a write with a token
        // that may have gone stale meanwhile, unless the loss signal came first: once it
        // is recorded, no write carries the token.
        let rounds = rng.gen_range(2..=4);
        let pauses: Vec<Duration> = (0..rounds)
            .map(|round| match round {
                0 => Duration::ZERO,
                _ if rng.gen_bool(0.04) => ttl + ttl / 2,
                _ => Duration::from_millis(rng.gen_range(0..200)),
            })
            .collect();
        let advisory = rng.gen_bool(0.25);
        let work = async {
            for pause in pauses {
                tokio::time::sleep(pause).await;
                op += 1;
                write_pg(&rec, &current, &pool, &key, t, op).await;
                op += 1;
                write_http(
                    &rec,
                    &current,
                    &fenced_http,
                    &config.resource_url,
                    &format!("/cells/{key}"),
                    Some(t),
                    op,
                )
                .await;
            }
            if advisory {
                op += 1;
                let path = format!("/advisory/{key}");
                write_http(
                    &rec,
                    &current,
                    &plain_http,
                    &config.resource_url,
                    &path,
                    None,
                    op,
                )
                .await;
            }
        };
        tokio::pin!(work);
        let mut watching = true;
        loop {
            tokio::select! {
                () = &mut work => break,
                () = hold.lost(), if watching => {
                    watching = false;
                    let reason = match hold.loss() {
                        Some(HoldLoss::Forced { request_id }) => LossReason::Forced {
                            request_id: Some(request_id),
                        },
                        _ => LossReason::SessionEnded,
                    };
                    told(&rec, &current, &lock, t.get(), reason);
                }
            }
        }
        let mode = lost_releases % 3;
        let loss = lossy.load(Ordering::SeqCst).then(|| {
            lost_releases += 1;
            &proxies[proxy]
        });
        release(
            &rec,
            hold,
            &lock,
            t.get(),
            &current,
            &mut session,
            loss,
            mode,
        )
        .await;
        if races::join(&mut second).await {
            abandon(&rec, &mut session, &current).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..100))).await;
    }
    if let Some(s) = session {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, s.close()).await;
    }
    Ok(())
}

/// The lease id (-1 if the id cannot be read) and the tier (`None`: the home tier) of a
/// session, from its id (`[<tier>.]<lease hex>`).
fn session_of(s: &ClientSession) -> (i64, Option<String>) {
    match TieredSessionId::parse(s.id()) {
        Ok(id) => (id.lease.get(), id.tier),
        Err(_) => (-1, None),
    }
}

/// Records `Lost` for the hold of `s` when its lost signal fires.
fn watch_loss(s: &ClientSession, current: Current, rec: Recorder) {
    let s = s.clone();
    tokio::spawn(async move {
        s.lost().await;
        let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|(id, _, _)| id == s.id()) {
            if let Some((_, lock, token)) = cur.take() {
                let reason = Some(LossReason::SessionEnded);
                rec.record(Event::Lost {
                    lock,
                    token,
                    reason,
                });
            }
        }
    });
}

/// Records each renewal of `s` the service acknowledged (the open first), with its send
/// time, until the session is lost.
fn record_renewals(s: &ClientSession, rec: Recorder) {
    let s = s.clone();
    let (session, _) = session_of(&s);
    let ttl_ms = u64::try_from(s.ttl().as_millis()).unwrap_or(u64::MAX);
    tokio::spawn(async move {
        let mut last = s.renewed_at();
        rec.record(Event::Renewed {
            session,
            sent_ns: rec.ns_of(last),
            ttl_ms,
        });
        while let Some(at) = s.renewed_after(last).await {
            last = at;
            rec.record(Event::Renewed {
                session,
                sent_ns: rec.ns_of(at),
                ttl_ms,
            });
        }
    });
}

/// Records `Lost` for the hold with `token`, unless its loss was recorded already.
fn told(rec: &Recorder, current: &Current, lock: &LockName, token: u64, reason: LossReason) {
    let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
    if cur.as_ref().is_some_and(|(_, _, t)| *t == token) {
        cur.take();
        rec.record(Event::Lost {
            lock: lock.clone(),
            token,
            reason: Some(reason),
        });
    }
}

/// Gives up a session that does not answer: forgets its hold, if any (it ends by expiry
/// or by the close), records that, and closes the session.
async fn abandon(rec: &Recorder, session: &mut Option<ClientSession>, current: &Current) {
    {
        let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, lock, token)) = cur.take() {
            rec.record(Event::Abandoned { lock, token });
        }
    }
    if let Some(s) = session.take() {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, s.close()).await;
    }
}

/// Releases `hold`. With `loss`, the worker's proxy loses this release: everything for
/// a budget of [`LOST_RELEASE_BUDGET`] (`mode` 0: the client reports the outcome unknown
/// and goes on in the background), the answer to its first attempt (1) or its first
/// attempt (2).
#[allow(clippy::too_many_arguments)]
async fn release(
    rec: &Recorder,
    hold: RemoteHold,
    lock: &LockName,
    token: u64,
    current: &Current,
    session: &mut Option<ClientSession>,
    loss: Option<&LossyProxy>,
    mode: u64,
) {
    let budget = match (loss, mode) {
        (Some(p), 0) => {
            p.set(Loss::Everything);
            LOST_RELEASE_BUDGET
        }
        (Some(p), 1) => {
            p.set(Loss::NextAnswer);
            WRITE_TIMEOUT
        }
        (Some(p), _) => {
            p.set(Loss::NextRequest);
            WRITE_TIMEOUT
        }
        (None, _) => WRITE_TIMEOUT,
    };
    let result = hold.release_within(budget).await;
    if let Some(p) = loss {
        p.set(Loss::None);
    }
    match result {
        Ok(()) => {
            current.lock().unwrap_or_else(|e| e.into_inner()).take();
            rec.record(Event::Released {
                lock: lock.clone(),
                token,
                release_rev: None,
            });
        }
        Err(e) if e.is_outcome_unknown() => {
            // The client goes on sending it while the session lives; so does the worker.
            current.lock().unwrap_or_else(|e| e.into_inner()).take();
            rec.record(Event::ReleaseUnknown {
                lock: lock.clone(),
                token,
            });
        }
        Err(e) if e.is_not_held() || e.is_session_lost() || e.is_hold_forced() => {
            // The service says the hold is gone: that is the loss signal, unless the
            // client's own signal told it first.
            let reason = if e.is_hold_forced() {
                LossReason::Forced { request_id: None }
            } else if e.is_session_lost() {
                LossReason::SessionEnded
            } else {
                LossReason::NotHeld
            };
            told(rec, current, lock, token, reason);
            if e.is_session_lost() {
                *session = None;
            }
        }
        Err(_) => abandon(rec, session, current).await,
    }
}
