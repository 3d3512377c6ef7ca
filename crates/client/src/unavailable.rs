//! The retry of a request the service could not carry out for now: a 503 `quorum-lost`
//! (etcd could not commit in time), a 503 `namespace-moving` (a rehome of the namespace
//! to another tier is under way), a 503 `shutting-down` (the replica is stopping; behind
//! a load balancer the retry reaches another), a 503 `epoch-store-unavailable` (the
//! durable epoch store cannot be written for now) or a 503 `unavailable`. One policy, used by
//! [`ClientSession::acquire`](crate::ClientSession::acquire) and
//! [`Client::acquire`](crate::Client::acquire) (and so by the CLI): sent again after a
//! pause of 50 ms, doubling up to 1 s, each pause shortened by up to half at random (so
//! clients that failed together do not come back together), while the caller's deadline
//! leaves room for the pause. A 503 `epoch-mismatch` is not retried: it lasts until an
//! operator acts.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ClientError, ClientErrorKind};
use palisade_api::ProblemKind;

/// The first pause; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Whether the service answered that it cannot serve the request for now.
pub(crate) fn is_unavailable(e: &ClientError) -> bool {
    e.status() == Some(503)
        && match e.kind() {
            ClientErrorKind::Problem(p) => {
                matches!(
                    p,
                    ProblemKind::QuorumLost
                        | ProblemKind::NamespaceMoving
                        | ProblemKind::ShuttingDown
                        | ProblemKind::EpochStoreUnavailable
                )
            }
            ClientErrorKind::Other(slug) => slug == "unavailable",
            _ => false,
        }
}

/// A pause from half of `pause` to all of it.
fn jittered(pause: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    pause / 2 + pause.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// Runs `attempt` (given the time left until `deadline`) until it answers anything but
/// an unavailable service, or until the next pause would end past `deadline`; then the
/// last answer. A transport failure after an unavailable answer carries that answer in
/// its detail ([`ClientError::after`]).
pub(crate) async fn retry_within<T, F, Fut>(
    deadline: Instant,
    mut attempt: F,
) -> Result<T, ClientError>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut pause = FIRST_PAUSE;
    let mut unavailable: Option<ClientError> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match attempt(left).await {
            Err(e) if is_unavailable(&e) => {
                let wake = Instant::now() + jittered(pause);
                if wake >= deadline {
                    return Err(e);
                }
                tracing::debug!(error = %e, "service unavailable; trying again");
                unavailable = Some(e);
                tokio::time::sleep_until(wake).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            // The service said why it could not answer, then stopped answering: say both.
            Err(e) if *e.kind() == ClientErrorKind::Transport => {
                return Err(match &unavailable {
                    Some(earlier) => e.after(earlier),
                    None => e,
                })
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: ProblemKind, status: u16) -> ClientError {
        ClientError {
            kind: ClientErrorKind::Problem(kind),
            status: Some(status),
            detail: String::new(),
            source: None,
        }
    }

    #[test]
    fn only_a_503_that_passes_is_unavailable() {
        assert!(is_unavailable(&problem(ProblemKind::QuorumLost, 503)));
        assert!(is_unavailable(&problem(ProblemKind::NamespaceMoving, 503)));
        assert!(is_unavailable(&problem(ProblemKind::ShuttingDown, 503)));
        assert!(is_unavailable(&problem(
            ProblemKind::EpochStoreUnavailable,
            503
        )));
        assert!(!is_unavailable(&problem(ProblemKind::WrongTier, 409)));
        assert!(!is_unavailable(&problem(ProblemKind::EpochMismatch, 503)));
        assert!(!is_unavailable(&problem(
            ProblemKind::DeadlineExceeded,
            409
        )));
        let other = ClientError {
            kind: ClientErrorKind::Other("unavailable".into()),
            status: Some(503),
            detail: String::new(),
            source: None,
        };
        assert!(is_unavailable(&other));
    }

    #[test]
    fn a_pause_is_from_half_to_all_of_it() {
        for _ in 0..100 {
            let p = jittered(Duration::from_millis(100));
            assert!(
                p >= Duration::from_millis(50) && p <= Duration::from_millis(100),
                "{p:?}"
            );
        }
    }
}
