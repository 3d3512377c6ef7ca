//! Forwarding one request to the upstream: the URI rewritten to the upstream's base,
//! hop-by-hop headers stripped both ways (RFC 9110 §7.6.1), `Forwarded` (RFC 7239) and
//! `X-Forwarded-For`/`-Proto`/`-Host` added, bodies and trailers streamed both ways, the
//! upstream's failures answered 502 or 504, and an upgrade (WebSocket) spliced through
//! once the upstream agrees to it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::problem::ProxyProblem;

/// The upstream and the client that reaches it; clones share the connection pool (a
/// clone is one reference count).
#[derive(Clone)]
pub(crate) struct Forwarder {
    upstream: Arc<Upstream>,
}

struct Upstream {
    client: Client<HttpConnector, Body>,
    /// `http://host:port`, for problem documents.
    base: String,
    authority: http::uri::Authority,
    timeout: Duration,
}

impl Forwarder {
    /// A forwarder to `upstream` (`http://host:port`), connecting within `connect` and
    /// waiting `timeout` for each response head.
    pub(crate) fn new(upstream: &Uri, connect: Duration, timeout: Duration) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        let authority = upstream
            .authority()
            .cloned()
            .expect("a checked upstream has an authority");
        Forwarder {
            upstream: Arc::new(Upstream {
                client,
                base: format!("http://{authority}"),
                authority,
                timeout,
            }),
        }
    }

    pub(crate) async fn forward(self, mut req: Request<Body>) -> Response<Body> {
        let upgrade = upgrade_of(req.headers(), req.version());
        let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0);
        let (mut parts, body) = req.into_parts();
        let host = parts.headers.get(header::HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.upstream.authority.clone())
            .path_and_query(path)
            .build();
        let Ok(uri) = uri else {
            return ProxyProblem::BadPath
                .response("the request target cannot be sent on".into(), None);
        };
        parts.uri = uri;
        strip_hop_by_hop(&mut parts.headers);
        if let Some(protocol) = &upgrade {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol.clone());
        }
        if let Some(h) = &host {
            parts.headers.insert(header::HOST, h.clone());
        }
        add_forwarded(&mut parts.headers, peer, host.as_ref());
        parts.version = Version::HTTP_11;
        let body_failed = Arc::new(std::sync::Mutex::new(None));
        let streaming = Arc::new(AtomicU8::new(NOT_POLLED));
        let body = Body::new(Watched {
            body,
            failed: Arc::clone(&body_failed),
            streaming: Arc::clone(&streaming),
        });
        let request = Request::from_parts(parts, body);
        let sent = self.upstream.client.request(request);
        tokio::pin!(sent);
        // The upstream's time does not run while the client's body is still arriving: a
        // long upload, or a stalled one, is the client's (the listener's body stall bound
        // ends it), not the upstream's.
        let sent = loop {
            match tokio::time::timeout(self.upstream.timeout, &mut sent).await {
                Err(_) if streaming.load(Ordering::Acquire) == STREAMING => {}
                done => break done,
            }
        };
        let mut response = match sent {
            Err(_) => {
                return ProxyProblem::UpstreamTimeout.response(
                    format!(
                        "the upstream {} sent no response within {} ms",
                        self.upstream.base,
                        self.upstream.timeout.as_millis()
                    ),
                    Some(&self.upstream.base),
                )
            }
            Ok(Err(e)) => {
                if let Some(cause) = body_failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    // The client's body failed (it stalled or broke off): the client's
                    // failure, not the upstream's.
                    return ProxyProblem::BodyFailed
                        .response(format!("the request body could not be read: {cause}"), None);
                }
                let what = if e.is_connect() {
                    "cannot be reached"
                } else {
                    "broke off the exchange"
                };
                tracing::warn!(upstream = %self.upstream.base, error = %chain(&e), "upstream {what}");
                return ProxyProblem::UpstreamUnavailable.response(
                    format!("the upstream {} {what}: {}", self.upstream.base, chain(&e)),
                    Some(&self.upstream.base),
                );
            }
            Ok(Ok(response)) => response,
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_side) = client_side {
                let upstream_side = hyper::upgrade::on(&mut response);
                tokio::spawn(async move {
                    match tokio::try_join!(client_side, upstream_side) {
                        Ok((client, upstream)) => {
                            let mut client = TokioIo::new(client);
                            let mut upstream = TokioIo::new(upstream);
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        }
                        Err(e) => tracing::debug!(error = %e, "an upgrade did not complete"),
                    }
                });
                let (mut parts, _) = response.into_parts();
                let protocol = parts.headers.get(header::UPGRADE).cloned();
                strip_hop_by_hop(&mut parts.headers);
                parts
                    .headers
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                if let Some(p) = protocol {
                    parts.headers.insert(header::UPGRADE, p);
                }
                return Response::from_parts(parts, Body::empty());
            }
        }
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Response::from_parts(parts, Body::new(body))
    }
}

/// Where a request body is: not read yet, arriving, or done (ended or failed).
const NOT_POLLED: u8 = 0;
const STREAMING: u8 = 1;
const ENDED: u8 = 2;

pin_project_lite::pin_project! {
    /// A request body that records why it failed, so that the proxy can tell a client's
    /// body from an upstream's failure.
    struct Watched {
        #[pin]
        body: Body,
        failed: Arc<std::sync::Mutex<Option<String>>>,
        streaming: Arc<AtomicU8>,
    }
}

impl http_body::Body for Watched {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        let state = match &polled {
            Poll::Ready(Some(Err(e))) => {
                *this.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(chain(e));
                ENDED
            }
            Poll::Ready(None) => ENDED,
            _ => STREAMING,
        };
        this.streaming.store(state, Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl tower::Service<Request<Body>> for Forwarder {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// The protocol an HTTP/1.1 request asks to upgrade to (`Connection: upgrade` and an
/// `Upgrade` header), if any.
pub(crate) fn upgrade_of(headers: &HeaderMap, version: Version) -> Option<HeaderValue> {
    if version != Version::HTTP_11 {
        return None;
    }
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// The hop-by-hop fields of RFC 9110 §7.6.1 (and the ones RFC 2616 and common proxies
/// add), which apply to one connection and are not forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];
/// Never removed for being named in `Connection`.
const KEPT: [HeaderName; 3] = [
    HeaderName::from_static("fencing-token"),
    header::HOST,
    header::CONTENT_LENGTH,
];
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Removes the hop-by-hop fields and every field `Connection` names; keeps `TE:
/// trailers` (the one `TE` value that asks the next hop for trailers end to end) and
/// `Trailer`, which announces the trailers. One pass over the names when none is there
/// (the usual case).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    // A client cannot strip these by naming them in `Connection`: the token is what the
    // upstream checks again, the others frame and route the request.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !KEPT.contains(n))
        .collect();
    let trailers = headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Appends the client to `X-Forwarded-For` and `Forwarded`, and sets
/// `X-Forwarded-Proto` and `X-Forwarded-Host`.
fn add_forwarded(headers: &mut HeaderMap, peer: Option<SocketAddr>, host: Option<&HeaderValue>) {
    let ip = peer.map(|p| p.ip());
    if let Some(ip) = ip {
        let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
            Some(earlier) if !earlier.trim().is_empty() => format!("{earlier}, {ip}"),
            _ => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    if let Some(h) = host {
        headers.insert(X_FORWARDED_HOST, h.clone());
    }
    let mut element = String::new();
    if let Some(ip) = ip {
        element.push_str(&match ip {
            std::net::IpAddr::V4(v4) => format!("for={v4}"),
            std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
        });
        element.push(';');
    }
    element.push_str("proto=http");
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        if h.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            element.push_str(&format!(";host=\"{h}\""));
        }
    }
    let forwarded = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(earlier) if !earlier.trim().is_empty() => format!("{earlier}, {element}"),
        _ => element,
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert(header::FORWARDED, v);
    }
}

/// An error and its causes, `: `-joined.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_the_ones_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("fencing-token", HeaderValue::from_static("42"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get("fencing-token").unwrap(), "42");
        assert_eq!(h.get(header::TE).unwrap(), "trailers");
        for gone in ["connection", "keep-alive", "x-secret", "transfer-encoding"] {
            assert!(h.get(gone).is_none(), "{gone}");
        }
    }

    #[test]
    fn forwarded_fields_append_the_client() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        let host = HeaderValue::from_static("orders.example");
        add_forwarded(&mut h, Some("[::1]:5000".parse().unwrap()), Some(&host));
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, ::1");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "orders.example");
        assert_eq!(
            h.get(header::FORWARDED).unwrap(),
            "for=\"[::1]\";proto=http;host=\"orders.example\""
        );
    }

    #[test]
    fn only_an_http11_connection_upgrade_is_an_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_of(&h, Version::HTTP_11).unwrap(), "websocket");
        assert!(upgrade_of(&h, Version::HTTP_2).is_none());
        h.remove(header::CONNECTION);
        assert!(upgrade_of(&h, Version::HTTP_11).is_none());
    }
}
