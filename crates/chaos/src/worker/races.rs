//! Races on one session, with the run's session races on ([`WorkerConfig::races`]):
//! the acquires a lock service must tell apart when they come from one session.
//!
//! - **A reset acquire, sent again** ([`RaceKind::ResetRetry`]): the worker's proxy
//!   resets the client's side of the acquire's connection once the request reached the
//!   service ([`Loss::ResetClient`]), so the service goes on with it; the worker sends
//!   the acquire again on the same session at once. Two attempts of one acquire are then
//!   in the service together, and the one whose answer is lost must not take the other's
//!   grant for a leftover. When the second attempt is not granted, the first one's fate
//!   is unknown (it may have left a hold or a place in the queue on the session), so the
//!   worker gives the session up, as it does for an acquire with no answer.
//! - **Two tasks sharing the session** ([`RaceKind::SharedSession`]): a second task
//!   acquires the same lock on the same session while the worker's own acquire is under
//!   way, and releases at once whatever it is granted. It records its own
//!   `acquire_invoked` (before either answer), grant or failure, and the end of its
//!   hold. When it got no answer at all, the worker gives the session up after the cycle.
//!
//! What the service may answer either race is its own business (one of them may be
//! refused, or wait); what it must not do is hand out a hold and then end it behind the
//! holder's back, which the checker's rule (j) reports
//! (`check::Violation::HoldEndedUntold`).
//!
//! The choices come from a generator of their own, so a run with the races off makes
//! the same choices as before they existed.

use palisade_api::Mode;
use palisade_client::{ClientError, ClientErrorKind, ClientSession, RemoteHold};
use palisade_testkit::{Loss, LossyProxy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{session_of, Recorder, ACQUIRE_WAIT, CLASS, NAMESPACE, WRITE_TIMEOUT};
use crate::history::{Event, LockName, LossReason, RaceKind};

/// One cycle in this many resets its acquire, and one in this many shares its session.
const ONE_IN: u32 = 6;

/// Picks the cycles that race.
#[derive(Debug)]
pub(super) struct Races {
    rng: StdRng,
}

impl Races {
    /// The races of the worker `id` of a run seeded `seed`.
    pub(super) fn new(seed: u64, id: u32) -> Self {
        let mixed = seed ^ 0x5eed_ace5 ^ (u64::from(id) + 1).wrapping_mul(0xd1b5_4a32_d192_ed03);
        Races {
            rng: StdRng::seed_from_u64(mixed),
        }
    }

    /// The race this cycle runs, if any.
    pub(super) fn pick(&mut self) -> Option<RaceKind> {
        match self.rng.gen_range(0..ONE_IN) {
            0 => Some(RaceKind::ResetRetry),
            1 => Some(RaceKind::SharedSession),
            _ => None,
        }
    }
}

/// What became of an acquire.
pub(super) enum Acquired {
    /// The service answered.
    Answered(Result<RemoteHold, ClientError>),
    /// No usable answer (none in time, or a reset acquire whose retry was not granted):
    /// the session may hold what the worker does not know of, so it is given up.
    GiveUp(String),
}

/// Acquires `lock` on `s` exclusively, waiting [`ACQUIRE_WAIT`], within a budget.
pub(super) async fn acquire(
    s: &ClientSession,
    lock: &LockName,
    wait: std::time::Duration,
) -> Acquired {
    let acquire = s.acquire(NAMESPACE, CLASS, &lock.key, Mode::Exclusive, wait);
    match tokio::time::timeout(wait + WRITE_TIMEOUT, acquire).await {
        Ok(answer) => Acquired::Answered(answer),
        Err(_) => Acquired::GiveUp("no answer in time".into()),
    }
}

/// [`acquire`] through `proxy` armed to reset the client's side of the next request's
/// connection; on that reset, the acquire is sent again on the same session with the
/// time left of its wait (and [`Event::SessionRace`] recorded).
pub(super) async fn acquire_reset(
    rec: &Recorder,
    s: &ClientSession,
    proxy: &LossyProxy,
    lock: &LockName,
) -> Acquired {
    let deadline = Instant::now() + ACQUIRE_WAIT;
    proxy.set(Loss::ResetClient);
    let first = acquire(s, lock, ACQUIRE_WAIT).await;
    // The reset fires on the next request the session's client sends: the acquire,
    // unless a renewal went first.
    let fired = proxy.loss() == Loss::None;
    proxy.set(Loss::None);
    if fired {
        // The client itself sends an acquire whose connection was reset again, as the
        // same attempt (it gets that attempt's hold or place); only if that too went
        // unanswered does the worker send it once more, as a new attempt.
        rec.record(Event::SessionRace {
            lock: lock.clone(),
            race: RaceKind::ResetRetry,
        });
    }
    match first {
        Acquired::Answered(Err(e)) if fired && *e.kind() == ClientErrorKind::Transport => {
            let left = deadline.saturating_duration_since(Instant::now());
            match acquire(s, lock, left).await {
                Acquired::Answered(Ok(hold)) => Acquired::Answered(Ok(hold)),
                Acquired::Answered(Err(e)) => {
                    Acquired::GiveUp(format!("after a reset, the acquire sent again: {e}"))
                }
                Acquired::GiveUp(why) => {
                    Acquired::GiveUp(format!("after a reset, the acquire sent again: {why}"))
                }
            }
        }
        other => other,
    }
}

/// Starts the second task of a [`RaceKind::SharedSession`] race on `lock`: records the
/// race and its `acquire_invoked` now (before either task's answer), then acquires on
/// `s` and releases at once what it is granted. The task's output says whether the
/// session is in doubt (the acquire got no answer).
pub(super) fn spawn_second(rec: &Recorder, s: &ClientSession, lock: &LockName) -> JoinHandle<bool> {
    rec.record(Event::SessionRace {
        lock: lock.clone(),
        race: RaceKind::SharedSession,
    });
    rec.record(Event::AcquireInvoked { lock: lock.clone() });
    let (rec, s, lock) = (rec.clone(), s.clone(), lock.clone());
    tokio::spawn(async move {
        let hold = match acquire(&s, &lock, ACQUIRE_WAIT).await {
            Acquired::Answered(Ok(hold)) => hold,
            Acquired::Answered(Err(e)) => {
                let error = e.to_string();
                rec.record(Event::AcquireFailed { lock, error });
                return false;
            }
            Acquired::GiveUp(error) => {
                rec.record(Event::AcquireFailed { lock, error });
                return true;
            }
        };
        let (Some(t), Some(rev)) = (hold.token(), hold.grant_rev()) else {
            let error = "granted without a fencing token".to_owned();
            rec.record(Event::AcquireFailed { lock, error });
            let _ = hold.release().await;
            return false;
        };
        let (session, tier) = session_of(&s);
        let token = t.get();
        rec.record(Event::Granted {
            lock: lock.clone(),
            token,
            session,
            grant_rev: rev.as_i64(),
            tier,
        });
        let end = match hold.release_within(WRITE_TIMEOUT).await {
            Ok(()) => Event::Released {
                lock,
                token,
                release_rev: None,
            },
            Err(e) if e.is_outcome_unknown() => Event::ReleaseUnknown { lock, token },
            Err(e) if e.is_not_held() || e.is_session_lost() || e.is_hold_forced() => {
                let reason = if e.is_hold_forced() {
                    LossReason::Forced { request_id: None }
                } else if e.is_session_lost() {
                    LossReason::SessionEnded
                } else {
                    LossReason::NotHeld
                };
                Event::Lost {
                    lock,
                    token,
                    reason: Some(reason),
                }
            }
            // The release failed otherwise: the hold is given up with the session,
            // which the worker closes after the cycle.
            Err(_) => {
                rec.record(Event::Abandoned { lock, token });
                return true;
            }
        };
        rec.record(end);
        false
    })
}

/// Waits for the second task of a race, if one runs; whether the session is in doubt.
pub(super) async fn join(second: &mut Option<JoinHandle<bool>>) -> bool {
    match second.take() {
        Some(task) => task.await.unwrap_or(true),
        None => false,
    }
}
