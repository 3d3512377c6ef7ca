//! SIGINT and SIGTERM during a run, and the thread the run's parts live on.
//!
//! The parts (etcd members, PostgreSQL, replicas, workers, the resource service, the
//! tailer) are started and driven on a thread of their own with a runtime of its own; on
//! network hosts that thread first enters the runner's host, so every socket the runner
//! opens is on the run's network. The first SIGINT or SIGTERM cancels that thread's work:
//! every part is dropped, which kills its processes and removes its directories, and the
//! runtime's tasks end, so the history gets only whole lines. Further signals while that
//! goes on are ignored (and said so on stderr): a half-removed run is worse than a slow
//! stop. The caller then removes the run directory and the network, and exits with the
//! shell's code for the signal ([`Interrupt::exit_code`]: 130, 143).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::oneshot;

use crate::error::ChaosError;
use crate::net::Host;

/// How long the parts' runtime may take to end its tasks once the run is over.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(10);

/// The signal that interrupted a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// SIGINT (Ctrl-C).
    Sigint,
    /// SIGTERM (a supervisor's stop).
    Sigterm,
}

impl Interrupt {
    /// The exit code for it: 128 plus the signal's number, as shells report a process
    /// the signal ended (130 for SIGINT, 143 for SIGTERM).
    pub fn exit_code(self) -> u8 {
        match self {
            Interrupt::Sigint => 130,
            Interrupt::Sigterm => 143,
        }
    }
}

impl fmt::Display for Interrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Interrupt::Sigint => "SIGINT",
            Interrupt::Sigterm => "SIGTERM",
        })
    }
}

/// SIGINT and SIGTERM, caught from [`Interrupts::listen`] on (their default action, to
/// end the process at once, is replaced for the rest of the process's life).
pub(crate) struct Interrupts {
    int: Signal,
    term: Signal,
}

impl Interrupts {
    pub(crate) fn listen() -> Result<Interrupts, ChaosError> {
        let io = ChaosError::io;
        Ok(Interrupts {
            int: signal(SignalKind::interrupt()).map_err(io("catching SIGINT"))?,
            term: signal(SignalKind::terminate()).map_err(io("catching SIGTERM"))?,
        })
    }

    /// The next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) -> Interrupt {
        tokio::select! {
            _ = self.int.recv() => Interrupt::Sigint,
            _ = self.term.recv() => Interrupt::Sigterm,
        }
    }
}

/// How the work on the run's thread ended.
pub(crate) enum Ended<T> {
    /// It finished (well or not).
    Done(T),
    /// A signal cancelled it; everything it held is dropped.
    Interrupted(Interrupt),
}

/// Runs `work()` on a thread of its own (entering `host`'s network first, when given) with
/// a runtime of its own, until it finishes or a signal comes; see the module docs.
///
/// # Errors
///
/// [`ChaosError::Net`] if the host cannot be entered, [`ChaosError::Io`] if the thread or
/// its runtime cannot be made, [`ChaosError::Panicked`] if the work panicked.
pub(crate) async fn on_own_thread<T, F, Fut>(
    interrupts: &mut Interrupts,
    host: Option<Host>,
    work: F,
) -> Result<Ended<T>, ChaosError>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let (cancel, cancelled) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("chaos-run".into())
        .spawn(move || -> Result<Option<T>, ChaosError> {
            if let Some(host) = &host {
                host.enter()?;
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("chaos-run")
                .build()
                .map_err(ChaosError::io("building the run's runtime"))?;
            let out = runtime.block_on(async move {
                tokio::select! {
                    v = work() => Some(v),
                    _ = cancelled => None,
                }
            });
            runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
            Ok(out)
        })
        .map_err(ChaosError::io("starting the run's thread"))?;
    let mut joined = tokio::task::spawn_blocking(move || thread.join());
    let signal = tokio::select! {
        // The signal first: a Ctrl-C at a terminal reaches the children too, and the
        // work may fail of that at once; the run was still interrupted.
        biased;
        s = interrupts.next() => s,
        j = &mut joined => {
            // `cancel` is still here, so the work was not cancelled: it returned.
            return finished(j)?
                .map(Ended::Done)
                .ok_or_else(|| ChaosError::Panicked("the run's work was cancelled".into()));
        }
    };
    eprintln!(
        "chaos: {signal}: stopping the run and removing its processes, directories and \
         network hosts; further SIGINT and SIGTERM are ignored until that is done"
    );
    let _ = cancel.send(());
    loop {
        tokio::select! {
            j = &mut joined => {
                // What the work returned is dropped: the run was interrupted.
                finished(j)?;
                return Ok(Ended::Interrupted(signal));
            }
            again = interrupts.next() => {
                eprintln!("chaos: {again} ignored: still cleaning up");
            }
        }
    }
}

type Joined<T> = Result<std::thread::Result<Result<Option<T>, ChaosError>>, tokio::task::JoinError>;

fn finished<T>(joined: Joined<T>) -> Result<Option<T>, ChaosError> {
    match joined {
        Ok(Ok(out)) => out,
        Ok(Err(panic)) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "(no message)".to_owned());
            Err(ChaosError::Panicked(message))
        }
        Err(e) => Err(ChaosError::Panicked(format!(
            "joining the run's thread: {e}"
        ))),
    }
}
