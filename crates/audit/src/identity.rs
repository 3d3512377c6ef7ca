//! Who made a write: the mTLS peer's SPIFFE ID, or the client a trusted proxy vouches for
//! in `x-forwarded-client-cert` (Envoy's XFCC format). See [`CallerIdentity`].

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::{Extensions, HeaderMap, HeaderName};

/// The `x-forwarded-client-cert` header.
pub const XFCC: HeaderName = HeaderName::from_static("x-forwarded-client-cert");

/// The mTLS peer's SPIFFE ID (URI SAN of its certificate), put in the request extensions
/// by whatever terminates TLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerSpiffeId(String);

impl PeerSpiffeId {
    /// Wraps the peer's SPIFFE ID.
    pub fn new(id: impl Into<String>) -> Self {
        PeerSpiffeId(id.into())
    }

    /// The SPIFFE ID.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Names the caller of a request.
///
/// [`caller`](Self::caller) decides, per request:
///
/// 1. If the request came from a **trusted proxy** (its mTLS peer SPIFFE ID, or its
///    socket address from axum's `ConnectInfo<SocketAddr>`, is one configured with
///    [`trust_proxy_spiffe_id`](Self::trust_proxy_spiffe_id) / [`trust_proxy_addr`](Self::trust_proxy_addr)):
///    the `URI=` of the **last** element of its single `x-forwarded-client-cert` header
///    (the element the nearest proxy appended), when that is a `spiffe://` URI; else none.
/// 2. Otherwise: the peer's own SPIFFE ID ([`PeerSpiffeId`] in the request extensions,
///    put there by the TLS acceptor), and the header is **ignored**, as anyone can send it.
///
/// ```
/// use palisade_audit::{CallerIdentity, PeerSpiffeId};
///
/// let identity = CallerIdentity::new().trust_proxy_spiffe_id("spiffe://example.org/envoy");
/// let mut req = http::Request::new(());
/// req.headers_mut().insert(
///     "x-forwarded-client-cert",
///     "By=spiffe://example.org/api;Hash=abc;URI=spiffe://example.org/billing".parse().unwrap(),
/// );
/// req.extensions_mut().insert(PeerSpiffeId::new("spiffe://example.org/envoy"));
/// assert_eq!(identity.caller(req.headers(), req.extensions()).as_deref(), Some("spiffe://example.org/billing"));
///
/// // The same header from anyone else is ignored: the peer itself is the caller.
/// req.extensions_mut().insert(PeerSpiffeId::new("spiffe://example.org/mallory"));
/// assert_eq!(identity.caller(req.headers(), req.extensions()).as_deref(), Some("spiffe://example.org/mallory"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct CallerIdentity {
    proxy_ids: Vec<String>,
    proxy_addrs: Vec<IpAddr>,
}

impl CallerIdentity {
    /// Trusts no proxy: the caller is the mTLS peer.
    pub fn new() -> Self {
        CallerIdentity::default()
    }

    /// Trusts the XFCC header from a peer with this SPIFFE ID.
    pub fn trust_proxy_spiffe_id(mut self, id: impl Into<String>) -> Self {
        self.proxy_ids.push(id.into());
        self
    }

    /// Trusts the XFCC header from a peer at this address (needs axum's
    /// `into_make_service_with_connect_info::<SocketAddr>()`).
    pub fn trust_proxy_addr(mut self, addr: IpAddr) -> Self {
        self.proxy_addrs.push(addr);
        self
    }

    /// The caller of a request with these headers and extensions, if known.
    pub fn caller(&self, headers: &HeaderMap, extensions: &Extensions) -> Option<String> {
        let peer = extensions.get::<PeerSpiffeId>();
        let trusted = peer.is_some_and(|p| self.proxy_ids.iter().any(|id| id == p.as_str()))
            || extensions
                .get::<ConnectInfo<SocketAddr>>()
                .is_some_and(|ConnectInfo(addr)| self.proxy_addrs.contains(&addr.ip()));
        if trusted {
            let mut values = headers.get_all(&XFCC).iter();
            let value = values.next()?;
            if values.next().is_some() {
                return None;
            }
            let uri = last_element_uri(value.to_str().ok()?)?;
            return uri.starts_with("spiffe://").then_some(uri);
        }
        peer.map(|p| p.as_str().to_owned())
    }

    /// This extractor as a closure for
    /// [`FenceLayer::with_caller`](palisade_fence::FenceLayer::with_caller).
    pub fn into_fn(
        self,
    ) -> impl Fn(&HeaderMap, &Extensions) -> Option<String> + Send + Sync + 'static {
        move |headers, extensions| self.caller(headers, extensions)
    }
}

/// The `URI` value of the last element of an XFCC header, unquoted.
///
/// Elements are separated by `,`, pairs by `;`, keys from values by `=`; a value may be
/// double-quoted (then `,`, `;` and `=` inside are literal, and `\"` is a quote).
fn last_element_uri(header: &str) -> Option<String> {
    let elements = split_unquoted(header, ',');
    let last = elements.last()?;
    let mut uri = None;
    for pair in split_unquoted(last, ';') {
        let (key, value) = pair.split_once('=')?;
        if key.trim().eq_ignore_ascii_case("uri") {
            if uri.is_some() {
                return None;
            }
            uri = Some(unquote(value.trim())?);
        }
    }
    uri.filter(|u| !u.is_empty())
}

fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn unquote(value: &str) -> Option<String> {
    let Some(inner) = value.strip_prefix('"') else {
        return Some(value.to_owned());
    };
    let inner = inner.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next()? } else { c });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(xfcc: &[&str], peer: Option<&str>, addr: Option<&str>) -> http::Request<()> {
        let mut req = http::Request::new(());
        for v in xfcc {
            req.headers_mut().append(XFCC, v.parse().unwrap());
        }
        if let Some(p) = peer {
            req.extensions_mut().insert(PeerSpiffeId::new(p));
        }
        if let Some(a) = addr {
            req.extensions_mut()
                .insert(ConnectInfo::<SocketAddr>(a.parse().unwrap()));
        }
        req
    }

    #[test]
    fn xfcc_is_read_only_from_a_trusted_proxy() {
        let id = CallerIdentity::new()
            .trust_proxy_spiffe_id("spiffe://td/envoy")
            .trust_proxy_addr("10.0.0.7".parse().unwrap());
        let caller = |r: http::Request<()>| id.caller(r.headers(), r.extensions());
        let xfcc = "By=spiffe://td/api;Hash=0a;URI=spiffe://td/billing";
        assert_eq!(
            caller(request(&[xfcc], Some("spiffe://td/envoy"), None)).as_deref(),
            Some("spiffe://td/billing")
        );
        assert_eq!(
            caller(request(&[xfcc], None, Some("10.0.0.7:5000"))).as_deref(),
            Some("spiffe://td/billing")
        );
        // Untrusted: the header is ignored, the peer (if any) is the caller.
        assert_eq!(
            caller(request(&[xfcc], Some("spiffe://td/other"), None)).as_deref(),
            Some("spiffe://td/other")
        );
        assert_eq!(caller(request(&[xfcc], None, Some("10.0.0.8:5000"))), None);
        assert_eq!(
            caller(request(&[], Some("spiffe://td/writer"), None)).as_deref(),
            Some("spiffe://td/writer")
        );
        // Trusted but no usable header: unknown, not the proxy.
        assert_eq!(caller(request(&[], Some("spiffe://td/envoy"), None)), None);
        assert_eq!(
            caller(request(&[xfcc, xfcc], Some("spiffe://td/envoy"), None)),
            None,
            "two headers"
        );
        assert_eq!(
            caller(request(
                &["By=spiffe://td/api;URI=https://x"],
                Some("spiffe://td/envoy"),
                None
            )),
            None
        );
    }

    #[test]
    fn xfcc_parsing_takes_the_last_element_and_honours_quotes() {
        assert_eq!(
            last_element_uri(
                "By=spiffe://a/x;URI=spiffe://a/first,By=spiffe://a/y;URI=spiffe://a/second"
            )
            .as_deref(),
            Some("spiffe://a/second")
        );
        assert_eq!(
            last_element_uri(r#"By=spiffe://a/x;Subject="CN=a,O=b;c";URI=spiffe://a/q"#).as_deref(),
            Some("spiffe://a/q")
        );
        assert_eq!(
            last_element_uri(r#"URI="spiffe://a/\"q\"""#).as_deref(),
            Some(r#"spiffe://a/"q""#)
        );
        assert_eq!(last_element_uri("By=spiffe://a/x;Hash=1"), None);
        assert_eq!(
            last_element_uri("URI=spiffe://a/1;URI=spiffe://a/2"),
            None,
            "ambiguous"
        );
        assert_eq!(last_element_uri("URI"), None);
        assert_eq!(last_element_uri(r#"URI="spiffe://a/unterminated"#), None);
    }
}
