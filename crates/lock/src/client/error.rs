//! The client's error: the service's problem type, or a transport failure.

use std::fmt;

/// What went wrong, from the problem `type` the service answered with (its slug after
/// `urn:palisade:problem:`), or on the way there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientErrorKind {
    /// `invalid-input` (400, 405, 413, 415, 422).
    InvalidInput,
    /// `unauthenticated` (401).
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
    /// `epoch-mismatch` (503).
    EpochMismatch,
    /// `quorum-lost` (503).
    QuorumLost,
    /// Another problem type, by slug.
    Other(String),
    /// The request did not get an answer (connection refused, reset...).
    Transport,
    /// The answer could not be decoded.
    Decode,
}

impl ClientErrorKind {
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
            "epoch-mismatch" => ClientErrorKind::EpochMismatch,
            "quorum-lost" => ClientErrorKind::QuorumLost,
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
    pub(crate) fn transport(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ClientError {
            kind: ClientErrorKind::Transport,
            status: None,
            detail: "no answer from the lock service".into(),
            source: Some(e.into()),
        }
    }

    pub(crate) fn decode(status: u16, detail: impl Into<String>) -> Self {
        ClientError {
            kind: ClientErrorKind::Decode,
            status: Some(status),
            detail: detail.into(),
            source: None,
        }
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
                "lock service answered {s} ({:?}): {}",
                self.kind, self.detail
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
