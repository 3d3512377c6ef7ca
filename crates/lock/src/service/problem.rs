//! Errors as `application/problem+json` (RFC 9457), one stable `type` URI per kind.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::{Error, ErrorKind, InvalidInput};

/// The kinds of problem the API reports. Each has a stable `type` URI,
/// `urn:palisade:problem:<slug>`, and one status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the request was refused before anything was written (bad JSON, unknown
    /// fields, bad names or keys, TTLs out of range...). 413 for an oversized body.
    InvalidInput,
    /// 401: no caller identity, or a dev identity header without dev mode.
    Unauthenticated,
    /// 403: the caller may not do this (authorization config, or another identity's
    /// session).
    Forbidden,
    /// 404: unknown namespace, class, route or session.
    NotFound,
    /// 409: the hold is no longer held (released, expired, force-released).
    NotHeld,
    /// 409: the wait deadline passed while others held the lock.
    DeadlineExceeded,
    /// 410: the session's lease is gone.
    SessionLost,
    /// 409: the force release request was already approved.
    AlreadyApproved,
    /// 429: a quota of the namespace (`held_lease_quota` or `op_rate_quota`, named in
    /// the detail) is reached; `op_rate_quota` answers carry `Retry-After` (seconds).
    QuotaExceeded,
    /// 503: grants are refused until an operator advances the epoch.
    EpochMismatch,
    /// 409: the epoch is at its maximum and cannot be advanced.
    EpochExhausted,
    /// 503: etcd could not commit in time.
    QuorumLost,
    /// 502: etcd or the force release database answered with an unexpected error.
    Upstream,
    /// 500: a record in etcd or the durable epoch record could not be read.
    Internal,
}

impl ProblemKind {
    /// Every kind, in declaration order.
    pub const ALL: [ProblemKind; 14] = [
        ProblemKind::InvalidInput,
        ProblemKind::Unauthenticated,
        ProblemKind::Forbidden,
        ProblemKind::NotFound,
        ProblemKind::NotHeld,
        ProblemKind::DeadlineExceeded,
        ProblemKind::SessionLost,
        ProblemKind::AlreadyApproved,
        ProblemKind::QuotaExceeded,
        ProblemKind::EpochMismatch,
        ProblemKind::EpochExhausted,
        ProblemKind::QuorumLost,
        ProblemKind::Upstream,
        ProblemKind::Internal,
    ];

    /// The slug used in the `type` URI.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::InvalidInput => "invalid-input",
            ProblemKind::Unauthenticated => "unauthenticated",
            ProblemKind::Forbidden => "forbidden",
            ProblemKind::NotFound => "not-found",
            ProblemKind::NotHeld => "not-held",
            ProblemKind::DeadlineExceeded => "deadline-exceeded",
            ProblemKind::SessionLost => "session-lost",
            ProblemKind::AlreadyApproved => "already-approved",
            ProblemKind::QuotaExceeded => "quota-exceeded",
            ProblemKind::EpochMismatch => "epoch-mismatch",
            ProblemKind::EpochExhausted => "epoch-exhausted",
            ProblemKind::QuorumLost => "quorum-lost",
            ProblemKind::Upstream => "upstream",
            ProblemKind::Internal => "internal",
        }
    }

    /// The `type` URI: `urn:palisade:problem:<slug>`.
    pub fn type_uri(self) -> String {
        format!("urn:palisade:problem:{}", self.slug())
    }

    /// The default status code.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::InvalidInput => StatusCode::BAD_REQUEST,
            ProblemKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ProblemKind::Forbidden => StatusCode::FORBIDDEN,
            ProblemKind::NotFound => StatusCode::NOT_FOUND,
            ProblemKind::NotHeld
            | ProblemKind::DeadlineExceeded
            | ProblemKind::EpochExhausted
            | ProblemKind::AlreadyApproved => StatusCode::CONFLICT,
            ProblemKind::SessionLost => StatusCode::GONE,
            ProblemKind::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ProblemKind::EpochMismatch | ProblemKind::QuorumLost => StatusCode::SERVICE_UNAVAILABLE,
            ProblemKind::Upstream => StatusCode::BAD_GATEWAY,
            ProblemKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Left in the response's extensions for the metrics layer.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProblemSeen {
    pub(super) kind: ProblemKind,
    /// For [`ProblemKind::QuotaExceeded`]: the op rate quota (else the held quota).
    pub(super) op_rate: bool,
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

impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        let detail = e.to_string();
        let kind = match e.kind() {
            ErrorKind::InvalidInput(
                InvalidInput::UnknownNamespace(_) | InvalidInput::UnknownClass(_),
            ) => ProblemKind::NotFound,
            ErrorKind::InvalidInput(_) => ProblemKind::InvalidInput,
            ErrorKind::NotHeld => ProblemKind::NotHeld,
            ErrorKind::EpochMismatch(_) => ProblemKind::EpochMismatch,
            ErrorKind::EpochExhausted => ProblemKind::EpochExhausted,
            ErrorKind::QuorumLost => ProblemKind::QuorumLost,
            ErrorKind::DeadlineExceeded => ProblemKind::DeadlineExceeded,
            ErrorKind::SessionLost => ProblemKind::SessionLost,
            ErrorKind::Etcd => ProblemKind::Upstream,
            _ => ProblemKind::Internal,
        };
        if kind == ProblemKind::Internal || kind == ProblemKind::Upstream {
            tracing::error!(error = ?e, "lock service error");
        }
        Problem::new(kind, detail)
    }
}
