//! Errors as `application/problem+json` (RFC 9457), one stable `type` URI per kind.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use palisade_api::{InvalidInput, ProblemKind};
use palisade_lock::{Error, ErrorKind};

/// The `Retry-After` of a 503 `epoch-store-unavailable`: long enough for a restarted
/// database or a restored grant, short enough that a waiting caller does not give up.
const EPOCH_STORE_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Left in the response's extensions for the metrics layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProblemSeen {
    pub(crate) kind: ProblemKind,
    /// For [`ProblemKind::QuotaExceeded`]: the op rate quota (else the held quota).
    pub(crate) op_rate: bool,
}

/// One problem response.
#[derive(Debug, Clone)]
pub struct Problem {
    kind: ProblemKind,
    status: StatusCode,
    detail: String,
    retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    r#type: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

impl Problem {
    /// A problem of `kind` with its default status and a human-readable detail.
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Problem {
            kind,
            status: kind.status(),
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// Another status code (e.g. 413, 415 and 405 for invalid input).
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Adds a `Retry-After` header: `after` rounded up to whole seconds, at least 1.
    pub fn with_retry_after(mut self, after: std::time::Duration) -> Self {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.retry_after = Some(secs.max(1));
        self
    }

    /// The kind.
    pub fn kind(&self) -> ProblemKind {
        self.kind
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = Body {
            r#type: self.kind.type_uri(),
            title: self.kind.slug(),
            status: self.status.as_u16(),
            detail: &self.detail,
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = (self.status, bytes).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        resp.extensions_mut().insert(ProblemSeen {
            kind: self.kind,
            op_rate: self.detail.starts_with("op_rate_quota"),
        });
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<InvalidInput> for Problem {
    fn from(reason: InvalidInput) -> Self {
        Problem::from(Error::from(reason))
    }
}

impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        // The problem type already says the input was refused: the detail says why.
        let detail = match e.kind() {
            ErrorKind::InvalidInput(reason) => reason.to_string(),
            _ => e.to_string(),
        };
        let kind = match e.kind() {
            ErrorKind::InvalidInput(
                InvalidInput::UnknownNamespace(_)
                | InvalidInput::UnknownClass(_)
                | InvalidInput::UnknownSession(_),
            ) => ProblemKind::NotFound,
            ErrorKind::InvalidInput(_) => ProblemKind::InvalidInput,
            ErrorKind::NotHeld => ProblemKind::NotHeld,
            ErrorKind::EpochMismatch(_) => ProblemKind::EpochMismatch,
            ErrorKind::EpochExhausted => ProblemKind::EpochExhausted,
            ErrorKind::QuorumLost => ProblemKind::QuorumLost,
            ErrorKind::DeadlineExceeded => ProblemKind::DeadlineExceeded,
            ErrorKind::SessionLost => ProblemKind::SessionLost,
            ErrorKind::AlreadyHeld { .. } => ProblemKind::AlreadyHeld,
            ErrorKind::AcquireInFlight { .. } => ProblemKind::AcquireInFlight,
            ErrorKind::Etcd => ProblemKind::Upstream,
            ErrorKind::QuotaExceeded { .. } | ErrorKind::SessionLimit { .. } => {
                ProblemKind::QuotaExceeded
            }
            ErrorKind::WrongTier { .. } => ProblemKind::WrongTier,
            ErrorKind::EpochStore => {
                // The operator's store is down or refuses the service's role: no token
                // can be handed out until it is back, which a retry may find.
                tracing::error!(error = ?e, "the durable epoch store failed");
                return Problem::new(ProblemKind::EpochStoreUnavailable, detail)
                    .with_retry_after(EPOCH_STORE_RETRY);
            }
            ErrorKind::NamespaceFenced { .. }
            | ErrorKind::RehomeInProgress { .. }
            | ErrorKind::DrainTimeout { .. } => {
                return Problem::new(ProblemKind::NamespaceMoving, detail)
                    .with_retry_after(std::time::Duration::from_secs(1));
            }
            _ => ProblemKind::Internal,
        };
        if kind == ProblemKind::Internal || kind == ProblemKind::Upstream {
            tracing::error!(error = ?e, "lock service error");
        }
        Problem::new(kind, detail)
    }
}
