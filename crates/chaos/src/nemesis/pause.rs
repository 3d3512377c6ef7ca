//! The pause-worker fault: a holder stops between recording a write and sending it, its
//! session expires, and it is continued once a write with a higher token has committed
//! where its own write lands, so the run sees a stale write refused rather than one
//! admitted because nobody wrote since.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::error::ChaosError;
use crate::history::{FaultKind, Phase};
use crate::procs;
use crate::runner::{Run, TTL};
use crate::schedule::PlannedFault;
use crate::worker::{PAUSE_ARMED_FOR, PAUSE_NEXT_WRITE};

/// Holders tried in turn; the last one is stopped from here if it writes nothing while
/// armed.
const TRIES: u32 = 3;
/// How long past [`PAUSE_ARMED_FOR`] a worker is watched for stopping itself: it arms on
/// its own clock when the line arrives, after it was sent.
const ARMED_MARGIN: Duration = Duration::from_millis(500);
/// How long the runner may take to read the entry a worker recorded before stopping.
const ENTRY_READ_WAIT: Duration = Duration::from_secs(1);
/// How long a paused worker is kept stopped past its pause for its write to go stale: a
/// write with a higher token committed on that resource (stopped from here: its lock
/// granted to another worker).
const STALE_WAIT: Duration = Duration::from_secs(10);
/// Time for the next holder's first write, once its grant is seen (stopped from here).
const NEXT_HOLDER_WRITES: Duration = Duration::from_millis(500);
/// How often the nemesis looks at what the workers recorded.
const POLL: Duration = Duration::from_millis(50);

impl Run {
    /// Pauses a holder for the TTL plus `f.hold`, then until its next write is stale.
    pub(super) async fn pause_worker(&mut self, f: &PlannedFault) -> Result<(), ChaosError> {
        let kind = FaultKind::PauseWorker;
        let Some(count) = self.workers.as_ref().map(procs::Workers::count) else {
            return Ok(());
        };
        let pause = TTL + f.hold;
        for attempt in 0..TRIES {
            let pick = f.pick.wrapping_add(attempt);
            // A worker that holds a lock, when one does.
            let held = self.holding.pick(pick);
            let i = held
                .as_ref()
                .map_or(pick as usize % count, |(w, _, _)| *w as usize);
            let Some(pid) = self.workers.as_ref().and_then(|w| w.pid(i)) else {
                return Ok(());
            };
            let worker = u32::try_from(i).unwrap_or(u32::MAX);
            let told_ns = self.clock.at_ns();
            self.tell(i, PAUSE_NEXT_WRITE).await;
            let last = attempt + 1 == TRIES;
            // Before the last try's arming runs out, so a worker stopped from here does
            // not also stop itself once continued.
            let watch = if last {
                PAUSE_ARMED_FOR - ARMED_MARGIN
            } else {
                PAUSE_ARMED_FOR + ARMED_MARGIN
            };
            let itself = procs::wait_stopped(pid, watch).await;
            if !itself && !last {
                continue;
            }
            let how = if itself {
                "stopped itself before sending a write"
            } else {
                procs::signal(pid, Signal::SIGSTOP);
                "stopped (SIGSTOP)"
            };
            self.fault_on(
                kind,
                Phase::Start,
                format!("worker {i} {how} for {} ms", pause.as_millis()),
                i,
            );
            let write = if itself {
                self.write_read(worker, told_ns).await
            } else {
                None
            };
            tokio::time::sleep(pause).await;
            match (&write, &held) {
                (Some((resource, token)), _) => {
                    self.wait_until(|run| run.holding.committed_above(resource, *token))
                        .await;
                }
                (None, Some((_, lock, token))) => {
                    self.wait_until(|run| run.holding.granted_above(lock, *token))
                        .await;
                    tokio::time::sleep(NEXT_HOLDER_WRITES).await;
                }
                (None, None) => {}
            }
            procs::signal(pid, Signal::SIGCONT);
            let stale = match &write {
                Some((resource, token)) if self.holding.committed_above(resource, *token) => {
                    format!(", its write to {resource} with token {token} stale")
                }
                Some((resource, token)) => {
                    format!(", nothing above token {token} committed on {resource} meanwhile")
                }
                None => String::new(),
            };
            self.fault_on(
                kind,
                Phase::End,
                format!("worker {i} continued (SIGCONT){stale}"),
                i,
            );
            return Ok(());
        }
        Ok(())
    }

    /// The resource and token of the write worker `worker` recorded after `since_ns`,
    /// once the runner has read it.
    async fn write_read(&self, worker: u32, since_ns: u64) -> Option<(String, u64)> {
        let until = tokio::time::Instant::now() + ENTRY_READ_WAIT;
        loop {
            let write = self.holding.write_since(worker, since_ns);
            if write.is_some() || tokio::time::Instant::now() >= until {
                return write;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `done` holds, at most [`STALE_WAIT`].
    async fn wait_until(&self, done: impl Fn(&Self) -> bool) {
        let until = tokio::time::Instant::now() + STALE_WAIT;
        while !done(self) && tokio::time::Instant::now() < until {
            tokio::time::sleep(POLL).await;
        }
    }
}
