//! Refusals, and their `application/problem+json` (RFC 9457) bodies.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::FencingToken;

/// A custom refusal builder, set with
/// [`FenceLayer::with_rejection_response`](crate::FenceLayer::with_rejection_response).
pub(crate) type RespondFn = dyn Fn(&Rejection) -> Response<Bytes> + Send + Sync;

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    /// No `Fencing-Token` header: 428 Precondition Required.
    MissingToken,
    /// A header that is not exactly one decimal token below 2^63: 400 Bad Request.
    MalformedToken,
    /// The token is below the resource's mark: 409 Conflict.
    StaleToken,
    /// The high-water store did not answer: 503 Service Unavailable.
    StoreUnavailable,
}

impl RejectionKind {
    /// The response status.
    pub fn status(self) -> StatusCode {
        match self {
            RejectionKind::MissingToken => StatusCode::PRECONDITION_REQUIRED,
            RejectionKind::MalformedToken => StatusCode::BAD_REQUEST,
            RejectionKind::StaleToken => StatusCode::CONFLICT,
            RejectionKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The problem `type` URI: `urn:palisade:problem:<slug>`, the prefix of the lock
    /// service's problems (the slugs differ from theirs).
    pub fn problem_type(self) -> &'static str {
        match self {
            RejectionKind::MissingToken => "urn:palisade:problem:missing-token",
            RejectionKind::MalformedToken => "urn:palisade:problem:malformed-token",
            RejectionKind::StaleToken => "urn:palisade:problem:stale-token",
            RejectionKind::StoreUnavailable => "urn:palisade:problem:store-unavailable",
        }
    }

    fn title(self) -> &'static str {
        match self {
            RejectionKind::MissingToken => "Fencing token required",
            RejectionKind::MalformedToken => "Malformed fencing token",
            RejectionKind::StaleToken => "Stale fencing token",
            RejectionKind::StoreUnavailable => "Fencing check unavailable",
        }
    }
}

/// A refused write. The layer puts it in the rejection response's extensions, so outer
/// layers (audit, metrics) can read why without parsing the body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// Why.
    pub kind: RejectionKind,
    /// The resource key.
    pub resource: String,
    /// The refused token, when the header held a well-formed one.
    pub token: Option<FencingToken>,
    /// The resource's mark, for a stale token.
    pub highest: Option<FencingToken>,
}

impl Rejection {
    /// The RFC 9457 problem document: `type`, `title`, `status`, `detail`, and the
    /// extension members `resource`, `token` and `highest` (tokens as decimal strings,
    /// present when known).
    pub fn problem(&self) -> serde_json::Value {
        let detail = match self.kind {
            RejectionKind::MissingToken => {
                format!("writes to {} require a Fencing-Token header", self.resource)
            }
            RejectionKind::MalformedToken => {
                "the Fencing-Token header must be one decimal integer below 2^63".to_owned()
            }
            RejectionKind::StaleToken => format!(
                "token {} is below the highest token {} seen for {}",
                opt(self.token),
                opt(self.highest),
                self.resource
            ),
            RejectionKind::StoreUnavailable => {
                "the high-water store did not answer; retry".to_owned()
            }
        };
        let mut doc = serde_json::json!({
            "type": self.kind.problem_type(),
            "title": self.kind.title(),
            "status": self.kind.status().as_u16(),
            "detail": detail,
            "resource": self.resource,
        });
        if let Some(t) = self.token {
            doc["token"] = t.to_string().into();
        }
        if let Some(h) = self.highest {
            doc["highest"] = h.to_string().into();
        }
        doc
    }

    /// The default refusal: the [`problem`](Self::problem) document as
    /// `application/problem+json` with the kind's status.
    pub fn problem_response(&self) -> Response<Bytes> {
        let body = Bytes::from(self.problem().to_string());
        let mut response = Response::new(body);
        *response.status_mut() = self.kind.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }

    /// Builds the refusal with `respond` (or the problem document) and puts `self` in its
    /// extensions.
    pub(crate) fn into_response<B: From<Bytes>>(self, respond: Option<&RespondFn>) -> Response<B> {
        let response = match respond {
            Some(respond) => respond(&self),
            None => self.problem_response(),
        };
        let mut response = response.map(B::from);
        response.extensions_mut().insert(self);
        response
    }
}

fn opt(t: Option<FencingToken>) -> String {
    t.map_or_else(|| "?".to_owned(), |t| t.to_string())
}
