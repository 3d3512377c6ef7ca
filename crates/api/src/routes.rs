//! The service's routes: each path written once, here. The server declares its handlers
//! on these templates (axum's `{param}` syntax); clients build concrete paths with the
//! functions, which percent-encode every parameter as one path segment.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// `POST`: open a session.
pub const SESSIONS: &str = "/v1/sessions";
/// `DELETE`: close a session.
pub const SESSION: &str = "/v1/sessions/{session}";
/// `POST`: renew a session's lease.
pub const KEEPALIVE: &str = "/v1/sessions/{session}/keepalive";
/// `POST`: acquire a lock (long-polls up to `wait_ms`).
pub const ACQUIRE: &str = "/v1/locks/acquire";
/// `POST`: release a hold.
pub const RELEASE: &str = "/v1/locks/release";
/// `GET`: a lock's holders and waiters (`?namespace=&class=&key=`).
pub const STATUS: &str = "/v1/locks/status";
/// `GET`: every namespace.
pub const NAMESPACES: &str = "/v1/namespaces";
/// `PUT`: create or update a namespace.
pub const NAMESPACE: &str = "/v1/namespaces/{ns}";
/// `GET`: a namespace's classes.
pub const CLASSES: &str = "/v1/namespaces/{ns}/classes";
/// `PUT`: create or update a class.
pub const CLASS: &str = "/v1/namespaces/{ns}/classes/{class}";
/// `POST`: move a namespace to another etcd cluster tier (admin).
pub const REHOME: &str = "/v1/namespaces/{ns}/rehome";
/// `GET`: the epoch record.
pub const EPOCH: &str = "/v1/epoch";
/// `POST`: advance the epoch.
pub const ADVANCE_EPOCH: &str = "/v1/epoch/advance";
/// `POST`: request a force release.
pub const FORCE_RELEASES: &str = "/v1/force-releases";
/// `POST`: approve a force release (a second admin).
pub const APPROVE_FORCE_RELEASE: &str = "/v1/force-releases/{id}/approve";
/// `GET`: the OpenAPI 3.1 document.
pub const OPENAPI: &str = "/v1/openapi.json";
/// `GET`: Prometheus metrics.
pub const METRICS: &str = "/metrics";

/// Everything but unreserved characters (RFC 3986) is encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn enc(s: &str) -> impl std::fmt::Display + '_ {
    utf8_percent_encode(s, SEGMENT)
}

/// [`SESSION`] for one session id.
pub fn session(id: &str) -> String {
    format!("/v1/sessions/{}", enc(id))
}

/// [`KEEPALIVE`] for one session id.
pub fn keepalive(id: &str) -> String {
    format!("/v1/sessions/{}/keepalive", enc(id))
}

/// [`STATUS`] with its query.
pub fn status(ns: &str, class: &str, key: &str) -> String {
    format!(
        "/v1/locks/status?namespace={}&class={}&key={}",
        enc(ns),
        enc(class),
        enc(key)
    )
}

/// [`NAMESPACE`] for one namespace.
pub fn namespace(ns: &str) -> String {
    format!("/v1/namespaces/{}", enc(ns))
}

/// [`REHOME`] of one namespace.
pub fn rehome(ns: &str) -> String {
    format!("/v1/namespaces/{}/rehome", enc(ns))
}

/// [`CLASSES`] of one namespace.
pub fn classes(ns: &str) -> String {
    format!("/v1/namespaces/{}/classes", enc(ns))
}

/// [`CLASS`] for one class.
pub fn class(ns: &str, class: &str) -> String {
    format!("/v1/namespaces/{}/classes/{}", enc(ns), enc(class))
}

/// [`APPROVE_FORCE_RELEASE`] for one request id.
pub fn approve_force_release(id: &str) -> String {
    format!("/v1/force-releases/{}/approve", enc(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each builder fills its template: the same path with each `{param}` replaced.
    #[test]
    fn builders_fill_their_templates_and_encode_parameters() {
        let fill = |t: &str, args: &[&str]| {
            let mut out = String::new();
            let mut rest = t;
            for a in args {
                let (head, tail) = rest.split_once('{').unwrap();
                out.push_str(head);
                out.push_str(a);
                rest = tail.split_once('}').unwrap().1;
            }
            out + rest
        };
        assert_eq!(session("00ab"), fill(SESSION, &["00ab"]));
        assert_eq!(keepalive("00ab"), fill(KEEPALIVE, &["00ab"]));
        assert_eq!(namespace("n"), fill(NAMESPACE, &["n"]));
        assert_eq!(classes("n"), fill(CLASSES, &["n"]));
        assert_eq!(class("n", "c"), fill(CLASS, &["n", "c"]));
        assert_eq!(
            approve_force_release("r-1"),
            fill(APPROVE_FORCE_RELEASE, &["r-1"])
        );
        assert!(status("n", "c", "k").starts_with(STATUS));
        assert_eq!(session("a/b c"), "/v1/sessions/a%2Fb%20c");
        assert_eq!(
            status("n", "c", "a/b&c=d"),
            "/v1/locks/status?namespace=n&class=c&key=a%2Fb%26c%3Dd"
        );
    }
}
