//! The client's error: the service's problem type, or a transport failure.

use std::fmt;

/// What went wrong, from the problem `type` the service answered with (its slug after
/// `urn:palisade:problem:`), or on the way there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientErrorKind {
    /// `invalid-input` (400, 405, 413, 415, 422).
    InvalidInput,
    /// `unauthenticated` (401: no client certificate, a certificate without exactly one
    /// SPIFFE ID, or no dev identity); or, with no HTTP status, the service refused the
    /// mTLS handshake (a client certificate that does not chain to its client CAs).
    Unauthenticated,
    /// `forbidden` (403).
    Forbidden,
    /// `not-found` (404).
    NotFound,
    /// `not-held` (409).
    NotHeld,
    /// `deadline-exceeded` (409).
    DeadlineExceeded,
    /// `session-lost` (410).
    SessionLost,
    /// `already-approved` (409): a force release request was approved before.
    AlreadyApproved,
    /// `quota-exceeded` (429): a quota of the namespace, named in the detail.
    QuotaExceeded,
    /// `epoch-mismatch` (503).
    EpochMismatch,
    /// `epoch-exhausted` (409): the epoch is at its maximum and cannot be advanced.
    EpochExhausted,
    /// `quorum-lost` (503).
    QuorumLost,
    /// `upstream` (502): etcd or the force release database failed.
    Upstream,
    /// `internal` (500).
    Internal,
    /// Another problem type, by slug.
    Other(String),
    /// The request did not get an answer (connection refused, reset, the service's
    /// certificate not trusted...).
    Transport,
    /// The client's own settings are unusable (service URL, CA bundle, client
    /// certificate or key); nothing was sent.
    Config,
    /// The answer could not be decoded.
    Decode,
}

impl ClientErrorKind {
    /// The problem type's slug (`forbidden`, `not-held`...); `transport`, `decode` and
    /// `config` for failures without one.
    pub fn slug(&self) -> &str {
        match self {
            ClientErrorKind::InvalidInput => "invalid-input",
            ClientErrorKind::Unauthenticated => "unauthenticated",
            ClientErrorKind::Forbidden => "forbidden",
            ClientErrorKind::NotFound => "not-found",
            ClientErrorKind::NotHeld => "not-held",
            ClientErrorKind::DeadlineExceeded => "deadline-exceeded",
            ClientErrorKind::SessionLost => "session-lost",
            ClientErrorKind::AlreadyApproved => "already-approved",
            ClientErrorKind::QuotaExceeded => "quota-exceeded",
            ClientErrorKind::EpochMismatch => "epoch-mismatch",
            ClientErrorKind::EpochExhausted => "epoch-exhausted",
            ClientErrorKind::QuorumLost => "quorum-lost",
            ClientErrorKind::Upstream => "upstream",
            ClientErrorKind::Internal => "internal",
            ClientErrorKind::Other(slug) => slug,
            ClientErrorKind::Transport => "transport",
            ClientErrorKind::Decode => "decode",
            ClientErrorKind::Config => "config",
        }
    }

    pub(crate) fn from_type(uri: &str) -> Self {
        let slug = uri.strip_prefix("urn:palisade:problem:").unwrap_or(uri);
        match slug {
            "invalid-input" => ClientErrorKind::InvalidInput,
            "unauthenticated" => ClientErrorKind::Unauthenticated,
            "forbidden" => ClientErrorKind::Forbidden,
            "not-found" => ClientErrorKind::NotFound,
            "not-held" => ClientErrorKind::NotHeld,
            "deadline-exceeded" => ClientErrorKind::DeadlineExceeded,
            "session-lost" => ClientErrorKind::SessionLost,
            "already-approved" => ClientErrorKind::AlreadyApproved,
            "quota-exceeded" => ClientErrorKind::QuotaExceeded,
            "epoch-mismatch" => ClientErrorKind::EpochMismatch,
            "epoch-exhausted" => ClientErrorKind::EpochExhausted,
            "quorum-lost" => ClientErrorKind::QuorumLost,
            "upstream" => ClientErrorKind::Upstream,
            "internal" => ClientErrorKind::Internal,
            other => ClientErrorKind::Other(other.to_owned()),
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
    /// A request that got no answer; a TLS alert from the service that refuses the
    /// client's certificate (or its absence) is [`ClientErrorKind::Unauthenticated`].
    pub(crate) fn transport(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let e = e.into();
        let (kind, detail) = match refusal_alert(&*e) {
            Some(alert) => (
                ClientErrorKind::Unauthenticated,
                format!("the lock service refused the TLS handshake ({alert:?}): it needs a client certificate that chains to its client CAs"),
            ),
            None => (
                ClientErrorKind::Transport,
                format!("no answer from the lock service: {}", root_cause(&*e)),
            ),
        };
        ClientError {
            kind,
            status: None,
            detail,
            source: Some(e),
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

    /// The hold is no longer held.
    pub fn is_not_held(&self) -> bool {
        self.kind == ClientErrorKind::NotHeld
    }

    /// The wait deadline passed while others held the lock.
    pub fn is_deadline_exceeded(&self) -> bool {
        self.kind == ClientErrorKind::DeadlineExceeded
    }

    /// The caller may not do this.
    pub fn is_forbidden(&self) -> bool {
        self.kind == ClientErrorKind::Forbidden
    }

    /// The session is gone (expired, closed) or unknown.
    pub fn is_session_lost(&self) -> bool {
        matches!(
            self.kind,
            ClientErrorKind::SessionLost | ClientErrorKind::NotFound
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

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::ClientErrorKind as K;

    #[test]
    fn every_kind_round_trips_through_its_type_uri() {
        for k in [
            K::InvalidInput,
            K::Unauthenticated,
            K::Forbidden,
            K::NotFound,
            K::NotHeld,
            K::DeadlineExceeded,
            K::SessionLost,
            K::AlreadyApproved,
            K::QuotaExceeded,
            K::EpochMismatch,
            K::EpochExhausted,
            K::QuorumLost,
            K::Upstream,
            K::Internal,
            K::Other("brand-new".into()),
        ] {
            let uri = format!("urn:palisade:problem:{}", k.slug());
            assert_eq!(K::from_type(&uri), k, "{uri}");
        }
    }

    /// Each problem the service can answer with has its own client kind (an exhaustive
    /// match: a new problem kind does not compile until it is mapped here).
    #[cfg(feature = "service")]
    #[test]
    fn every_service_problem_has_its_client_kind() {
        use crate::service::ProblemKind as P;
        let expected = |p: P| match p {
            P::InvalidInput => K::InvalidInput,
            P::Unauthenticated => K::Unauthenticated,
            P::Forbidden => K::Forbidden,
            P::NotFound => K::NotFound,
            P::NotHeld => K::NotHeld,
            P::DeadlineExceeded => K::DeadlineExceeded,
            P::SessionLost => K::SessionLost,
            P::AlreadyApproved => K::AlreadyApproved,
            P::QuotaExceeded => K::QuotaExceeded,
            P::EpochMismatch => K::EpochMismatch,
            P::EpochExhausted => K::EpochExhausted,
            P::QuorumLost => K::QuorumLost,
            P::Upstream => K::Upstream,
            P::Internal => K::Internal,
        };
        for p in P::ALL {
            assert_eq!(K::from_type(&p.type_uri()), expected(p), "{p:?}");
        }
    }
}
