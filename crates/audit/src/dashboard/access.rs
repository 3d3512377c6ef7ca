//! Who may use the dashboard: the `Host` a request names, and a bearer token.
//!
//! [`Access`] is a middleware on the dashboard's router ([`Access::protect`]), so it
//! applies to every route and to however the router is served.
//!
//! - **Host.** A request is served only if its host (the URI's authority, else the
//!   `Host` header; port ignored, case-insensitive, a trailing dot dropped) is on the
//!   allow-list: by default the address the dashboard listens on, plus `localhost`,
//!   `127.0.0.1` and `::1` for a loopback or unspecified address; more with
//!   [`Access::with_host`]. Anything else, a missing host included, is 403
//!   `forbidden`, its detail naming the host refused and the hosts allowed. This stops
//!   DNS rebinding: a page of another site whose name
//!   resolves to the dashboard's address reaches it with its own name as the host.
//! - **Bearer token** ([`Access::with_bearer_token`], the CLI's `--token-file`): every
//!   request must carry `Authorization: Bearer <token>`, else 401 `unauthenticated`
//!   with `WWW-Authenticate: Bearer`. Tokens are compared by their SHA-256 digests, so
//!   the time taken says nothing of how much of a guess was right.
//!
//! Refusals are `application/problem+json` bodies with the kind's `type` URI
//! (palisade-api's `ProblemKind`), naming the host refused or what was missing.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Router;
use palisade_api::ProblemKind;
use sha2::{Digest, Sha256};

/// Why an [`Access`] could not be built: the token or a host name it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// The bearer token is empty (a token file with nothing but white space, say).
    #[error("the bearer token is empty")]
    EmptyToken,
    /// The bearer token has a character a `Bearer` credential cannot carry (RFC 6750's
    /// `b64token`: letters, digits and `-._~+/`, then `=` padding).
    #[error("the bearer token has a character a Bearer credential cannot carry (byte {offset})")]
    TokenCharacter {
        /// The byte offset of the first such character.
        offset: usize,
    },
    /// An allowed host that is not a DNS name or an IP address (with no port).
    #[error("allowed host {0:?} is not a DNS name or an IP address (give no port or scheme)")]
    BadHost(String),
}

/// The dashboard's Host allow-list and optional bearer token (see the module docs).
#[derive(Clone)]
pub struct Access {
    hosts: Arc<Vec<String>>,
    token: Option<[u8; 32]>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("hosts", &self.hosts)
            .field("token", &self.token.map(|_| "<set>"))
            .finish()
    }
}

/// An IP address as the allow-list keeps it: IPv6 without brackets, lower case.
fn ip_name(ip: IpAddr) -> String {
    ip.to_string().to_ascii_lowercase()
}

impl Access {
    /// The allow-list of a dashboard listening on `addr`: its IP address; for a loopback
    /// or unspecified address (`127.0.0.1`, `::1`, `0.0.0.0`, `::`) also `localhost`,
    /// `127.0.0.1` and `::1`. No bearer token.
    pub fn for_listen_addr(addr: SocketAddr) -> Access {
        let ip = addr.ip();
        let mut hosts = Vec::new();
        if !ip.is_unspecified() {
            hosts.push(ip_name(ip));
        }
        if ip.is_loopback() || ip.is_unspecified() {
            for name in ["localhost", "127.0.0.1", "::1"] {
                if !hosts.iter().any(|h| h == name) {
                    hosts.push(name.to_owned());
                }
            }
        }
        Access {
            hosts: Arc::new(hosts),
            token: None,
        }
    }

    /// Also allows `host`: a DNS name (`audit.example.com`) or an IP address, without
    /// port; matched case-insensitively, a trailing dot ignored.
    ///
    /// # Errors
    ///
    /// [`AccessError::BadHost`] for anything else (a port, a scheme, a path, an empty
    /// name).
    pub fn with_host(mut self, host: &str) -> Result<Access, AccessError> {
        let name = normalize(host.trim_start_matches('[').trim_end_matches(']'))
            .filter(|n| is_dns_name(n) || n.parse::<IpAddr>().is_ok())
            .ok_or_else(|| AccessError::BadHost(host.to_owned()))?;
        if !self.hosts.contains(&name) {
            Arc::make_mut(&mut self.hosts).push(name);
        }
        Ok(self)
    }

    /// Requires `Authorization: Bearer <token>` on every request. `token` is taken as
    /// given, except for white space at either end (a file's trailing newline).
    ///
    /// # Errors
    ///
    /// [`AccessError::EmptyToken`]; [`AccessError::TokenCharacter`] for a character
    /// outside RFC 6750's `b64token`.
    pub fn with_bearer_token(mut self, token: &str) -> Result<Access, AccessError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AccessError::EmptyToken);
        }
        let body = token.trim_end_matches('=');
        if let Some(offset) = body
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || b"-._~+/".contains(&b)))
        {
            return Err(AccessError::TokenCharacter { offset });
        }
        if body.is_empty() {
            return Err(AccessError::TokenCharacter { offset: 0 });
        }
        self.token = Some(Sha256::digest(token.as_bytes()).into());
        Ok(self)
    }

    /// Whether a bearer token is required.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The allowed host names, lower case (IPv6 addresses without brackets).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// `router` behind this check: every route answers only an allowed host, and with
    /// the token if one is set.
    pub fn protect(self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(self, check))
    }

    /// The refusal of a request, if it is refused.
    fn refusal(&self, req: &axum::extract::Request) -> Option<Response> {
        let host = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                req.headers()
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            });
        let Some(host) = host else {
            return Some(problem(
                ProblemKind::Forbidden,
                "the request names no host (no Host header)".to_owned(),
            ));
        };
        let allowed = host_part(&host)
            .and_then(normalize)
            .is_some_and(|h| self.hosts.contains(&h));
        if !allowed {
            return Some(problem(
                ProblemKind::Forbidden,
                format!(
                    "this dashboard does not answer to host {:?}; it answers to {}",
                    host.chars().take(256).collect::<String>(),
                    self.hosts.join(", ")
                ),
            ));
        }
        let expected = self.token?;
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let detail = match presented {
            None => "this dashboard needs an Authorization: Bearer token",
            Some(t) if <[u8; 32]>::from(Sha256::digest(t.as_bytes())) == expected => return None,
            Some(_) => "the bearer token is not this dashboard's",
        };
        let mut resp = problem(ProblemKind::Unauthenticated, detail.to_owned());
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Some(resp)
    }
}

async fn check(
    axum::extract::State(access): axum::extract::State<Access>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match access.refusal(&req) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// The host of a `Host` value or authority: without userinfo and port, IPv6 without
/// brackets. `None` for a malformed one.
fn host_part(authority: &str) -> Option<&str> {
    let rest = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = rest.strip_prefix('[') {
        let (ip, after) = v6.split_once(']')?;
        return (after.is_empty() || after.starts_with(':')).then_some(ip);
    }
    Some(rest.split_once(':').map_or(rest, |(h, _)| h))
}

/// Lower case, one trailing dot dropped; `None` when empty.
fn normalize(host: &str) -> Option<String> {
    let h = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    (!h.is_empty()).then_some(h)
}

/// Letters, digits, `-` and `.`, labels of 1 to 63 characters, at most 253 in all.
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// An `application/problem+json` answer of `kind` (RFC 9457).
fn problem(kind: ProblemKind, detail: String) -> Response {
    let status = kind.status();
    let body = serde_json::json!({
        "type": kind.type_uri(),
        "title": kind.slug(),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_without_port_and_brackets() {
        assert_eq!(host_part("a.example:8090"), Some("a.example"));
        assert_eq!(host_part("[::1]:8090"), Some("::1"));
        assert_eq!(host_part("[::1]"), Some("::1"));
        assert_eq!(host_part("[::1]x"), None);
        assert_eq!(host_part("u@h:1"), Some("h"));
        assert_eq!(normalize("LocalHost."), Some("localhost".to_owned()));
    }

    #[test]
    fn the_default_list_is_the_listen_address_and_loopback_names_for_loopback() {
        let l = Access::for_listen_addr("127.0.0.1:1".parse().unwrap());
        assert_eq!(l.hosts(), ["127.0.0.1", "localhost", "::1"]);
        let v6 = Access::for_listen_addr("[::1]:1".parse().unwrap());
        assert_eq!(v6.hosts(), ["::1", "localhost", "127.0.0.1"]);
        let public = Access::for_listen_addr("192.0.2.7:1".parse().unwrap());
        assert_eq!(public.hosts(), ["192.0.2.7"]);
        let any = Access::for_listen_addr("0.0.0.0:1".parse().unwrap());
        assert_eq!(any.hosts(), ["localhost", "127.0.0.1", "::1"]);
    }

    #[test]
    fn allowed_hosts_and_tokens_are_checked_when_given() {
        let a = Access::for_listen_addr("192.0.2.7:1".parse().unwrap());
        let a = a
            .with_host("Audit.Example.")
            .unwrap()
            .with_host("[2001:db8::1]")
            .unwrap();
        assert_eq!(a.hosts(), ["192.0.2.7", "audit.example", "2001:db8::1"]);
        for bad in [
            "",
            "a.example:80",
            "http://a.example",
            "a b",
            "a/b",
            "-a.example",
        ] {
            assert_eq!(
                a.clone().with_host(bad).unwrap_err(),
                AccessError::BadHost(bad.to_owned())
            );
        }
        assert_eq!(
            a.clone().with_bearer_token(" \n").unwrap_err(),
            AccessError::EmptyToken
        );
        assert_eq!(
            a.clone().with_bearer_token("abc def").unwrap_err(),
            AccessError::TokenCharacter { offset: 3 }
        );
        assert!(a
            .with_bearer_token("s3cr3t-Token_/+=\n")
            .unwrap()
            .has_token());
    }
}
