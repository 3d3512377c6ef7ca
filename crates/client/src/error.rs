//! The client's error: the service's problem type, or a transport failure.

use std::fmt;

use palisade_api::ProblemKind;

/// What went wrong: the problem the service answered with, or a failure on the way
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientErrorKind {
    /// The service answered with a problem of this kind (its `type` URI). With no HTTP
    /// status, [`ProblemKind::Unauthenticated`] means the service refused the mTLS
    /// handshake (a client certificate that does not chain to its client CAs).
    Problem(ProblemKind),
    /// A problem type this version does not know, by slug.
    Other(String),
    /// The request did not get an answer (connection refused, reset, the service's
    /// certificate not trusted...).
    Transport,
    /// The client's own settings are unusable (service URL, CA bundle, client
    /// certificate or key); nothing was sent.
    Config,
    /// The answer could not be decoded.
    Decode,
    /// A release was sent, possibly more than once, and no definite answer came back
    /// within its budget: it may or may not have committed (see
    /// [`RemoteHold::release_within`](crate::RemoteHold::release_within)).
    OutcomeUnknown,
}

impl ClientErrorKind {
    /// The problem type's slug (`forbidden`, `not-held`...); `transport`, `decode` and
    /// `config` and `outcome-unknown` for failures without one.
    pub fn slug(&self) -> &str {
        match self {
            ClientErrorKind::Problem(p) => p.slug(),
            ClientErrorKind::Other(slug) => slug,
            ClientErrorKind::Transport => "transport",
            ClientErrorKind::Decode => "decode",
            ClientErrorKind::Config => "config",
            ClientErrorKind::OutcomeUnknown => "outcome-unknown",
        }
    }

    /// The problem kind, if the service answered with one this version knows.
    pub fn problem(&self) -> Option<ProblemKind> {
        match self {
            ClientErrorKind::Problem(p) => Some(*p),
            _ => None,
        }
    }

    pub(crate) fn from_type(uri: &str) -> Self {
        match ProblemKind::from_type_uri(uri) {
            Some(p) => ClientErrorKind::Problem(p),
            None => ClientErrorKind::Other(
                uri.strip_prefix(palisade_api::problem::TYPE_PREFIX)
                    .unwrap_or(uri)
                    .to_owned(),
            ),
        }
    }
}

/// The error of every client operation. Classify with [`ClientError::kind`] or the
/// query methods.
pub struct ClientError {
    pub(crate) kind: ClientErrorKind,
    pub(crate) status: Option<u16>,
    pub(crate) detail: String,
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ClientError {
    /// A request to the service at `base` that got no answer; a TLS alert from the
    /// service that refuses the client's certificate (or its absence) is
    /// [`ProblemKind::Unauthenticated`].
    pub(crate) fn transport(
        base: &str,
        e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let e = e.into();
        let (kind, detail) = match refusal_alert(&*e) {
            Some(alert) => (
                ClientErrorKind::Problem(ProblemKind::Unauthenticated),
                format!("the lock service refused the TLS handshake ({alert:?}): it needs a client certificate that chains to its client CAs"),
            ),
            None => (
                ClientErrorKind::Transport,
                format!("no answer from the lock service at {base}: {}", root_cause(&*e)),
            ),
        };
        ClientError {
            kind,
            status: None,
            detail,
            source: Some(e),
        }
    }

    /// A release whose budget ran out with its outcome open; `last` is the last
    /// attempt's failure.
    pub(crate) fn outcome_unknown(last: Option<ClientError>) -> Self {
        let detail = match &last {
            Some(e) => {
                format!("the release's outcome is unknown: no definite answer in time (last: {e})")
            }
            None => "the release's outcome is unknown: it was not sent in time".to_owned(),
        };
        ClientError {
            kind: ClientErrorKind::OutcomeUnknown,
            status: None,
            detail,
            source: last.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
        }
    }

    pub(crate) fn config(detail: impl Into<String>) -> Self {
        ClientError {
            kind: ClientErrorKind::Config,
            status: None,
            detail: detail.into(),
            source: None,
        }
    }

    /// Adds to a transport failure what the service answered the attempt before (a 503
    /// it was retried after): a replica that said it was shutting down and then stopped
    /// answering is reported as such, not as a bare refused connection.
    pub(crate) fn after(mut self, earlier: &ClientError) -> Self {
        let status = earlier.status.map(|s| format!("{s} ")).unwrap_or_default();
        self.detail = format!(
            "{} (its answer before that: {status}{}: {})",
            self.detail,
            earlier.kind.slug(),
            earlier.detail
        );
        self
    }

    /// Prefixes the detail with the file it is about.
    pub(crate) fn in_file(mut self, file: impl fmt::Display) -> Self {
        self.detail = format!("{file}: {}", self.detail);
        self
    }

    pub(crate) fn decode(status: u16, detail: impl Into<String>) -> Self {
        ClientError {
            kind: ClientErrorKind::Decode,
            status: Some(status),
            detail: detail.into(),
            source: None,
        }
    }

    /// The service's `detail` (or a description of the local failure).
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The kind.
    pub fn kind(&self) -> &ClientErrorKind {
        &self.kind
    }

    /// The HTTP status, if the service answered.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The problem kind the service answered with, if it is one this version knows.
    pub fn problem(&self) -> Option<ProblemKind> {
        self.kind.problem()
    }

    /// The hold is no longer held.
    pub fn is_not_held(&self) -> bool {
        self.problem() == Some(ProblemKind::NotHeld)
    }

    /// The wait deadline passed while others held the lock.
    pub fn is_deadline_exceeded(&self) -> bool {
        self.problem() == Some(ProblemKind::DeadlineExceeded)
    }

    /// The caller may not do this.
    pub fn is_forbidden(&self) -> bool {
        self.problem() == Some(ProblemKind::Forbidden)
    }

    /// A release got no definite answer within its budget.
    pub fn is_outcome_unknown(&self) -> bool {
        self.kind == ClientErrorKind::OutcomeUnknown
    }

    /// The hold was force-released.
    pub fn is_hold_forced(&self) -> bool {
        self.problem() == Some(ProblemKind::HoldForced)
    }

    /// The session is gone (expired, closed) or unknown.
    pub fn is_session_lost(&self) -> bool {
        matches!(
            self.problem(),
            Some(ProblemKind::SessionLost | ProblemKind::NotFound)
        )
    }
}

/// The errors below `e`, `e` first; `io::Error` wrappers are looked into (their
/// `source()` skips the wrapped error).
fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io
            .get_ref()
            .map(|inner| inner as &(dyn std::error::Error + 'static)),
        None => e.source(),
    })
}

/// A TLS alert by which the service refused the client's certificate.
fn refusal_alert(e: &(dyn std::error::Error + 'static)) -> Option<rustls::AlertDescription> {
    use rustls::AlertDescription as A;
    chain(e).find_map(|e| match e.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::AlertReceived(
            a @ (A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::AccessDenied
            | A::HandshakeFailure),
        )) => Some(*a),
        _ => None,
    })
}

/// The message of the innermost error.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    chain(e).last().map(ToString::to_string).unwrap_or_default()
}

impl fmt::Debug for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientError")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("detail", &self.detail)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(s) => write!(
                f,
                "lock service answered {s} {}: {}",
                self.kind.slug(),
                self.detail
            ),
            None => f.write_str(&self.detail),
        }
    }
}

impl ClientError {
    /// A transport failure to connect: the request never left this process, so it
    /// cannot have been acted on.
    pub(crate) fn is_connect_failure(&self) -> bool {
        self.kind == ClientErrorKind::Transport
            && self
                .source
                .as_deref()
                .and_then(|e| e.downcast_ref::<hyper_util::client::legacy::Error>())
                .is_some_and(hyper_util::client::legacy::Error::is_connect)
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_kind_and_an_unknown_slug_read_back_from_their_type_uri() {
        for p in ProblemKind::ALL {
            let k = ClientErrorKind::from_type(&p.type_uri());
            assert_eq!(k, ClientErrorKind::Problem(p));
            assert_eq!(k.slug(), p.slug());
        }
        let other = ClientErrorKind::from_type("urn:palisade:problem:brand-new");
        assert_eq!(other, ClientErrorKind::Other("brand-new".into()));
        assert_eq!(other.slug(), "brand-new");
    }
}
