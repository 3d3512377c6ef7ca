//! One retry policy for every etcd call: per-request timeouts inside the caller's
//! deadline, exponential backoff, and the classification of etcd errors.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

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
    /// The deadline passed while etcd kept failing transiently (or timing out).
    Unavailable(Option<etcd_client::Error>),
    /// The session's lease is gone.
    LeaseGone(etcd_client::Error),
    /// A non-retryable etcd error.
    Fatal(etcd_client::Error),
}

impl CallError {
    /// Maps to the public error; `unavailable` is the kind used when etcd could not
    /// answer in time (QuorumLost for a fenced acquire, for instance). A deadline that
    /// passed before any attempt is `DeadlineExceeded`.
    pub(crate) fn into_error(self, unavailable: ErrorKind) -> Error {
        match self {
            CallError::NoTime => Error::new(ErrorKind::DeadlineExceeded),
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
pub(crate) async fn call<T, F, Fut>(
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
    let mut attempted = false;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(if attempted {
                CallError::Unavailable(last)
            } else {
                CallError::NoTime
            });
        }
        attempted = true;
        let attempt_until = (now + per_request).min(deadline);
        match tokio::time::timeout_at(attempt_until, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => match classify(&e) {
                Failure::Transient => last = Some(e),
                Failure::LeaseGone => return Err(CallError::LeaseGone(e)),
                Failure::Fatal => return Err(CallError::Fatal(e)),
            },
            Err(_elapsed) => {}
        }
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
            started + Duration::from_millis(300),
            Duration::from_millis(50),
            || async { Err(status(Code::Unavailable)) },
        )
        .await;
        assert!(matches!(r, Err(CallError::Unavailable(Some(_)))));
        assert!(started.elapsed() < Duration::from_millis(600));

        let r: Result<(), _> = call(
            Instant::now() + Duration::from_secs(5),
            Duration::from_millis(50),
            || async { Err(status(Code::PermissionDenied)) },
        )
        .await;
        assert!(matches!(r, Err(CallError::Fatal(_))));
    }
}
