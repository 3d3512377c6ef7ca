//! The accept loop: [`serve`].
//!
//! Rule: nothing a client does ends the loop. A failed accept is retried after a
//! backoff (1 ms doubling to 1 s, back to 1 ms after an accept succeeds); when the
//! process is out of file descriptors it also closes the oldest idle connection to free
//! one, and logs (at most every 10 s) the open-file limit that was reached. Only
//! `shutdown` ends the loop.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use crate::conn::{serve_connection, Shared};
use crate::service::BoxError;
use crate::table::Table;
use crate::{ConnLimits, Peer};

/// What a listener speaks: plain HTTP/1.1, or HTTP/1.1 over TLS with this config (which
/// decides whether client certificates are asked for or required).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Transport {
    /// Plain HTTP/1.1.
    Plain,
    /// HTTP/1.1 over TLS.
    Tls(Arc<rustls::ServerConfig>),
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes, within `limits` (see
/// [`ConnLimits`]), then stops gracefully: no new connection is accepted, idle
/// connections close, each request in flight is answered, and `serve` returns once
/// every connection has closed. Bounding that wait is the caller's.
///
/// `make` builds the service of each connection from its [`Peer`] (called after the TLS
/// handshake). Each request reaches it with the client's address as axum's
/// `ConnectInfo<SocketAddr>` extension, and its body bounded by the body stall timeout.
///
/// Nothing a client does ends `serve`: see the module docs of the crate.
pub async fn serve<M, S, B>(
    listener: TcpListener,
    transport: Transport,
    limits: ConnLimits,
    make: M,
    shutdown: impl Future<Output = ()> + Send,
) where
    M: Fn(&Peer) -> S + Send + Sync + 'static,
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let served = Table::new(limits.max_connections);
    let reserve = Table::new(limits.probe_reserve);
    let shared = Arc::new(Shared {
        probe_paths: limits.probe_paths.clone().into(),
        limits,
        tls: match transport {
            Transport::Plain => None,
            Transport::Tls(config) => Some(TlsAcceptor::from(config)),
        },
        make,
    });
    // Every connection task holds a clone of `open`; `closed` reports when all are gone.
    let (open, mut closed) = mpsc::channel::<()>(1);
    let (stop, stopping) = watch::channel(false);
    let mut backoff = Backoff::default();
    let mut saturated = false;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, addr) = match accepted {
            Ok(accepted) => {
                backoff.reset();
                accepted
            }
            Err(e) if per_connection(&e) => continue,
            Err(e) => {
                let wait = backoff.next();
                if out_of_descriptors(&e) {
                    let freed = served.evict_oldest_idle() || reserve.evict_oldest_idle();
                    backoff.warn_once(|| {
                        tracing::warn!(
                            error = %e,
                            open_connections = served.len() + reserve.len(),
                            "cannot accept connections: out of file descriptors; {}; {}; retrying with a backoff",
                            nofile_limit(),
                            if freed { "closing the oldest idle connection" } else { "every connection has a request in flight" },
                        );
                    });
                } else {
                    backoff.warn_once(|| {
                        tracing::warn!(error = %e, "accepting a connection failed; retrying with a backoff");
                    });
                }
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(wait) => continue,
                }
            }
        };
        let (slot, probes_only) = match served.admit() {
            Some(slot) => {
                saturated = false;
                (slot, false)
            }
            None => {
                if !saturated {
                    saturated = true;
                    tracing::warn!(
                        max_connections = shared.limits.max_connections,
                        "connection limit reached with a request in flight on every connection; new connections get the probes only"
                    );
                }
                match reserve.admit() {
                    Some(slot) => (slot, true),
                    None => {
                        tracing::debug!(peer = %addr, "connection limit and probe reserve full; closed");
                        continue;
                    }
                }
            }
        };
        let (shared, open, stopping) = (Arc::clone(&shared), open.clone(), stopping.clone());
        tokio::spawn(async move {
            let _open = open;
            serve_connection(tcp, addr, shared, slot, probes_only, stopping).await;
        });
    }
    stop.send_replace(true);
    drop(open);
    let _ = closed.recv().await;
}

/// An accept error that concerns one connection only (it went away before it was
/// accepted): accept the next at once.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// EMFILE (the process's limit) or ENFILE (the system's).
fn out_of_descriptors(e: &io::Error) -> bool {
    use nix::errno::Errno;
    matches!(e.raw_os_error(), Some(code) if code == Errno::EMFILE as i32 || code == Errno::ENFILE as i32)
}

/// The process's open-file limit, as a phrase for the log.
fn nofile_limit() -> String {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => format!(
            "the open-file limit (RLIMIT_NOFILE) is {soft} (hard limit {hard}): raise it (ulimit -n, systemd LimitNOFILE=) or lower the connection cap"
        ),
        Err(e) => format!("the open-file limit (RLIMIT_NOFILE) could not be read: {e}"),
    }
}

/// The accept loop's backoff, and when its failures were last logged.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    logged: Option<Instant>,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(1);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How often a run of accept failures is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_FIRST,
            logged: None,
        }
    }
}

impl Backoff {
    /// An accept succeeded: the next failure waits the shortest time again.
    fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }

    /// How long to wait after this failure.
    fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }

    /// Runs `log` at most once per [`LOG_EVERY`]: a listener out of descriptors fails
    /// nearly every accept, and one line says it.
    fn warn_once(&mut self, log: impl FnOnce()) {
        if self.logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            self.logged = Some(Instant::now());
            log();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_one_second_and_resets_on_success() {
        let mut b = Backoff::default();
        let waits: Vec<_> = (0..12).map(|_| b.next()).collect();
        assert_eq!(waits[0], Duration::from_millis(1));
        assert_eq!(waits[1], Duration::from_millis(2));
        assert_eq!(waits[10], Duration::from_millis(1000));
        assert_eq!(waits[11], Duration::from_millis(1000));
        let mut logged = 0;
        b.warn_once(|| logged += 1);
        b.warn_once(|| logged += 1);
        assert_eq!(logged, 1);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(1));
        // Within ten seconds of the last line, success or not: no new line.
        b.warn_once(|| logged += 1);
        assert_eq!(logged, 1);
    }

    #[test]
    fn emfile_and_enfile_are_descriptor_exhaustion() {
        use nix::errno::Errno;
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(
            Errno::EMFILE as i32
        )));
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(
            Errno::ENFILE as i32
        )));
        assert!(!out_of_descriptors(&io::Error::from_raw_os_error(
            Errno::ECONNABORTED as i32
        )));
        assert!(per_connection(&io::Error::from_raw_os_error(
            Errno::ECONNABORTED as i32
        )));
        assert!(nofile_limit().contains("RLIMIT_NOFILE"));
    }
}
