//! The proxy's own refusals and failures, as RFC 9457 `application/problem+json`, in
//! the fence's `urn:palisade:problem:` namespace. The fence's refusals (428, 400, 409,
//! 503) are the layer's own, unchanged.

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

/// What the proxy itself answered, in the response's extensions (the metrics read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProblem {
    /// The upstream could not be reached or broke the exchange: 502.
    UpstreamUnavailable,
    /// The upstream sent no response head in time: 504.
    UpstreamTimeout,
    /// A protocol upgrade (WebSocket) on a route that is not open: 403.
    UpgradeRefused,
    /// A request target that is not an absolute path, climbs above `/`, or holds what
    /// upstreams route in different ways: 400.
    BadPath,
    /// The client's request body stalled or broke off while it was forwarded: 400.
    BodyFailed,
    /// A method a fenced route neither checks nor knows to be safe (a lower-case `put`,
    /// WebDAV's `MOVE`): 405.
    MethodNotChecked,
    /// A method-override header (`X-HTTP-Method-Override`, `X-HTTP-Method`,
    /// `X-Method-Override`) on a fenced route, which frameworks obey after the check: 400.
    MethodOverride,
}

impl ProxyProblem {
    /// The response status.
    pub fn status(self) -> StatusCode {
        match self {
            ProxyProblem::UpstreamUnavailable => StatusCode::BAD_GATEWAY,
            ProxyProblem::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyProblem::UpgradeRefused => StatusCode::FORBIDDEN,
            ProxyProblem::BadPath | ProxyProblem::BodyFailed | ProxyProblem::MethodOverride => {
                StatusCode::BAD_REQUEST
            }
            ProxyProblem::MethodNotChecked => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The problem `type` URI.
    pub fn problem_type(self) -> &'static str {
        match self {
            ProxyProblem::UpstreamUnavailable => "urn:palisade:problem:upstream-unavailable",
            ProxyProblem::UpstreamTimeout => "urn:palisade:problem:upstream-timeout",
            ProxyProblem::UpgradeRefused => "urn:palisade:problem:upgrade-refused",
            ProxyProblem::BadPath => "urn:palisade:problem:bad-path",
            ProxyProblem::BodyFailed => "urn:palisade:problem:body-failed",
            ProxyProblem::MethodNotChecked => "urn:palisade:problem:method-not-checked",
            ProxyProblem::MethodOverride => "urn:palisade:problem:method-override",
        }
    }

    /// Whether it is a failure on the way (counted in the forward failures), rather than
    /// a refusal before the route's service.
    pub(crate) fn on_the_way(self) -> bool {
        matches!(
            self,
            ProxyProblem::UpstreamUnavailable
                | ProxyProblem::UpstreamTimeout
                | ProxyProblem::BodyFailed
        )
    }

    /// The metrics' label.
    pub fn label(self) -> &'static str {
        match self {
            ProxyProblem::UpstreamUnavailable => "upstream_unavailable",
            ProxyProblem::UpstreamTimeout => "upstream_timeout",
            ProxyProblem::UpgradeRefused => "refused_upgrade",
            ProxyProblem::BadPath => "refused_bad_path",
            ProxyProblem::BodyFailed => "body_failed",
            ProxyProblem::MethodNotChecked => "refused_method",
            ProxyProblem::MethodOverride => "refused_method_override",
        }
    }

    fn title(self) -> &'static str {
        match self {
            ProxyProblem::UpstreamUnavailable => "Upstream unavailable",
            ProxyProblem::UpstreamTimeout => "Upstream timed out",
            ProxyProblem::UpgradeRefused => "Upgrade refused",
            ProxyProblem::BadPath => "Bad request path",
            ProxyProblem::BodyFailed => "Request body failed",
            ProxyProblem::MethodNotChecked => "Method not checked",
            ProxyProblem::MethodOverride => "Method override refused",
        }
    }

    /// The response: `type`, `title`, `status`, `detail`, plus `upstream` (the
    /// upstream's base URL) for the upstream's failures; `self` in the extensions.
    pub(crate) fn response(self, detail: String, upstream: Option<&str>) -> Response<Body> {
        let mut doc = serde_json::json!({
            "type": self.problem_type(),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": detail,
        });
        if let Some(u) = upstream {
            doc["upstream"] = u.into();
        }
        let mut response = Response::new(Body::from(Bytes::from(doc.to_string())));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response.extensions_mut().insert(self);
        response
    }
}
