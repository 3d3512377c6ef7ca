//! One retry policy for every etcd call: per-request timeouts inside the caller's
//! deadline, exponential backoff, and the classification of etcd errors.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, ErrorKind, Result};

/// How an etcd failure should be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Worth retrying (on another endpoint): `Unavailable` (no leader, connection
    /// refused), a request timeout, a transport error.
    Transient,
    /// The lease named in the request does not exist (gRPC `NotFound`, etcd's
    /// "requested lease not found"): the session is gone.
    LeaseGone,
    /// Anything else.
    Fatal,
}

pub(crate) fn classify(e: &etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Aborted
            | Code::Cancelled => Failure::Transient,
            Code::NotFound => Failure::LeaseGone,
            _ => Failure::Fatal,
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => Failure::Transient,
        _ => Failure::Fatal,
    }
}

/// Exponential backoff: 20 ms doubling to 400 ms.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            next: Duration::from_millis(20),
        }
    }

    /// Sleeps the next step, but never past `deadline`.
    pub(crate) async fn wait(&mut self, deadline: Instant) {
        let until = (Instant::now() + self.next).min(deadline);
        tokio::time::sleep_until(until).await;
        self.next = (self.next * 2).min(Duration::from_millis(400));
    }
}

/// The outcome of one retried etcd call that did not succeed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The deadline had passed before a first attempt: no answer about etcd at all.
    NoTime,
    /// The deadline passed before etcd was seen failing: the only attempts that got no
    /// answer were cut short by it, before their per-request timeout. Whether that is
    /// etcd's failure depends on whose deadline it was: see [`CallError::into_error`]
    /// and [`CallError::into_caller_error`].
    Cut,
    /// The deadline passed while etcd kept failing: transient errors, or attempts that
    /// got no answer within their whole per-request timeout.
    Unavailable(Option<etcd_client::Error>),
    /// The session's lease is gone.
    LeaseGone(etcd_client::Error),
    /// A non-retryable etcd error.
    Fatal(etcd_client::Error),
}

impl CallError {
    /// Maps to the public error, for a call whose deadline is the callee's own budget
    /// (a multiple of the request timeout): `unavailable` is the kind used when etcd
    /// could not answer in time (QuorumLost, for instance), attempts cut short by that
    /// budget included. A deadline that passed before any attempt is `DeadlineExceeded`.
    pub(crate) fn into_error(self, unavailable: ErrorKind) -> Error {
        match self {
            CallError::Cut => Error::new(unavailable),
            e => e.into_caller_error(unavailable),
        }
    }

    /// Maps to the public error, for a call whose deadline is the caller's (an
    /// acquire's): as [`CallError::into_error`], except that attempts cut short by the
    /// caller's deadline, with etcd never seen failing, are `DeadlineExceeded`, not
    /// `unavailable`: a short deadline on a healthy cluster is no lost quorum (and must
    /// not turn into an `open` class's unprotected grant).
    pub(crate) fn into_caller_error(self, unavailable: ErrorKind) -> Error {
        match self {
            CallError::NoTime | CallError::Cut => Error::new(ErrorKind::DeadlineExceeded),
            CallError::Unavailable(Some(e)) => Error::with_source(unavailable, e),
            CallError::Unavailable(None) => Error::new(unavailable),
            CallError::LeaseGone(e) => Error::with_source(ErrorKind::SessionLost, e),
            CallError::Fatal(e) => Error::with_source(ErrorKind::Etcd, e),
        }
    }
}

/// Runs `op` until it succeeds, fails for good, or `deadline` passes. Each attempt gets
/// at most `per_request` (and never past the deadline); transient failures are retried
/// after a backoff. Only use it for requests that are safe to repeat.
///
/// When the deadline passes, the call failed with [`CallError::Unavailable`] only if
/// etcd was seen failing (an error, or no answer within a whole `per_request`); an
/// attempt that the deadline cut short proves nothing about etcd, so a call whose
/// attempts were all cut short (a caller's short deadline on a healthy cluster) ends
/// in [`CallError::Cut`]. What depends on it: an `open` class hands out unprotected
/// grants on a lost quorum, never on a caller's deadline.
///
/// Each attempt runs in an INFO span `etcd` with the fields `op` (`name`, such as
/// `acquire.txn`), `attempt` (1, 2, ...) and `outcome`: `ok`, `transient` (retried),
/// `timeout` (no answer within `per_request`; retried), `cut` (no answer before the
/// caller's deadline, which came first), `lease_gone` or `fatal`. A failed
/// attempt also logs its error at DEBUG inside the span. etcd-client balances requests
/// over the endpoints without saying which one answered, so the span has no endpoint.
pub(crate) async fn call<T, F, Fut>(
    name: &'static str,
    deadline: Instant,
    per_request: Duration,
    mut op: F,
) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let mut backoff = Backoff::new();
    let mut last = None;
    // Whether etcd was seen failing: an error, or no answer in a whole `per_request`.
    let mut failed = false;
    let mut attempt = 0u32;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(if failed {
                CallError::Unavailable(last)
            } else if attempt > 0 {
                CallError::Cut
            } else {
                CallError::NoTime
            });
        }
        attempt += 1;
        let span = tracing::info_span!("etcd", op = name, attempt, outcome = tracing::field::Empty);
        let whole = now + per_request <= deadline;
        let attempt_until = (now + per_request).min(deadline);
        let answer = tokio::time::timeout_at(attempt_until, op())
            .instrument(span.clone())
            .await;
        let outcome = match answer {
            Ok(Ok(v)) => {
                span.record("outcome", "ok");
                return Ok(v);
            }
            Ok(Err(e)) => {
                let failure = classify(&e);
                span.in_scope(|| tracing::debug!(error = %e, ?failure, "etcd call failed"));
                match failure {
                    Failure::Transient => {
                        last = Some(e);
                        failed = true;
                        "transient"
                    }
                    Failure::LeaseGone => {
                        span.record("outcome", "lease_gone");
                        return Err(CallError::LeaseGone(e));
                    }
                    Failure::Fatal => {
                        span.record("outcome", "fatal");
                        return Err(CallError::Fatal(e));
                    }
                }
            }
            Err(_elapsed) if whole => {
                failed = true;
                "timeout"
            }
            Err(_elapsed) => "cut",
        };
        span.record("outcome", outcome);
        drop(span);
        backoff.wait(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn status(code: Code) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(Status::new(code, "etcdserver: whatever the text says"))
    }

    #[test]
    fn errors_are_classified_by_code_not_text() {
        assert_eq!(classify(&status(Code::Unavailable)), Failure::Transient);
        assert_eq!(
            classify(&status(Code::DeadlineExceeded)),
            Failure::Transient
        );
        assert_eq!(classify(&status(Code::NotFound)), Failure::LeaseGone);
        assert_eq!(classify(&status(Code::PermissionDenied)), Failure::Fatal);
        assert_eq!(classify(&status(Code::InvalidArgument)), Failure::Fatal);
    }

    #[tokio::test]
    async fn call_retries_transient_failures_and_stops_at_the_deadline() {
        let mut attempts = 0;
        let r = call(
            "test",
            Instant::now() + Duration::from_secs(5),
            Duration::from_millis(100),
            || {
                attempts += 1;
                let n = attempts;
                async move {
                    if n < 3 {
                        Err(status(Code::Unavailable))
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(r.unwrap(), 3);

        let started = Instant::now();
        let r: Result<(), _> = call(
            "test",
            started + Duration::from_millis(300),
            Duration::from_millis(50),
            || async { Err(status(Code::Unavailable)) },
        )
        .await;
        assert!(matches!(r, Err(CallError::Unavailable(Some(_)))));
        assert!(started.elapsed() < Duration::from_millis(600));

        let r: Result<(), _> = call(
            "test",
            Instant::now() + Duration::from_secs(5),
            Duration::from_millis(50),
            || async { Err(status(Code::PermissionDenied)) },
        )
        .await;
        assert!(matches!(r, Err(CallError::Fatal(_))));
    }

    #[tokio::test]
    async fn a_deadline_that_cuts_the_only_attempts_short_is_not_unavailability() {
        // etcd never answers; the caller's deadline comes before one whole attempt.
        let r: Result<(), _> = call(
            "test",
            Instant::now() + Duration::from_millis(30),
            Duration::from_millis(100),
            std::future::pending,
        )
        .await;
        assert!(matches!(r, Err(CallError::Cut)), "{r:?}");
        let e = CallError::Cut;
        assert_eq!(
            e.into_caller_error(ErrorKind::QuorumLost).kind(),
            &ErrorKind::DeadlineExceeded
        );
        assert_eq!(
            CallError::Cut.into_error(ErrorKind::QuorumLost).kind(),
            &ErrorKind::QuorumLost
        );
        // One whole attempt without an answer, then the deadline cuts the next: etcd
        // was seen failing.
        let r: Result<(), _> = call(
            "test",
            Instant::now() + Duration::from_millis(150),
            Duration::from_millis(100),
            std::future::pending,
        )
        .await;
        assert!(matches!(r, Err(CallError::Unavailable(None))), "{r:?}");
        // A transient error and then a cut attempt: unavailable, with the error.
        let mut n = 0;
        let r: Result<(), _> = call(
            "test",
            Instant::now() + Duration::from_millis(60),
            Duration::from_millis(100),
            || {
                n += 1;
                let first = n == 1;
                async move {
                    if first {
                        Err(status(Code::Unavailable))
                    } else {
                        std::future::pending().await
                    }
                }
            },
        )
        .await;
        assert!(matches!(r, Err(CallError::Unavailable(Some(_)))), "{r:?}");
    }
}
