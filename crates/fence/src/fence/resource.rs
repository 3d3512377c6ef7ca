//! The default mapping from a request to its resource key.

use http::Uri;
use percent_encoding::percent_decode_str;

/// The request path with every percent-escape decoded (invalid UTF-8 replaced by U+FFFD):
/// the default resource key of [`FenceLayer`](crate::FenceLayer).
///
/// Routers match and extract *decoded* path segments (axum serves `/orders/%31` from
/// `/orders/{id}` with `id = "1"`), so a key taken from the raw path would give one
/// resource two high-water marks, and a stale writer could bypass the mark of
/// `/orders/1` by sending `/orders/%31`. Decoding can only merge keys (`/a%2Fb` and
/// `/a/b` share one mark), which refuses more, never less.
///
/// ```
/// use http::Uri;
/// use palisade_fence::decoded_path;
///
/// assert_eq!(decoded_path(&Uri::from_static("/orders/%31?x=1")), "/orders/1");
/// assert_eq!(decoded_path(&Uri::from_static("/a%2Fb")), "/a/b");
/// ```
pub fn decoded_path(uri: &Uri) -> String {
    percent_decode_str(uri.path())
        .decode_utf8_lossy()
        .into_owned()
}
