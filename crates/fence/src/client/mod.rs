//! The client-side layer: stamp `Fencing-Token` on outgoing requests.
//!
//! [`FencingTokenLayer`] sets (overriding) the `Fencing-Token` header of every request
//! from a [`TokenSource`] — typically the hold that the lock service granted. When the
//! source has no token (the hold was lost), the header is removed and the request goes
//! out without one: a fenced resource then refuses it with 428, an advisory one records it
//! as unprotected. A `Fencing-Token` header set by the caller is always replaced or
//! removed: only the source decides.
//!
//! # Examples
//!
//! ```
//! use palisade_fence::{FencingToken, FencingTokenLayer};
//! use tower::ServiceBuilder;
//!
//! # fn wrap<S>(http_client: S) {
//! let token: FencingToken = "281474976715098".parse().unwrap();
//! let client = ServiceBuilder::new().layer(FencingTokenLayer::new(token)).service(http_client);
//! # drop(client);
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use http::{HeaderValue, Request};
use std::task::{Context, Poll};
use tower::{Layer, Service};

use crate::fence::FENCING_TOKEN;
use crate::FencingToken;

/// Where the client layer gets the token to send: a hold, or a fixed token.
pub trait TokenSource: Send + Sync + 'static {
    /// The current token, or `None` when there is none to send (the hold is gone).
    fn token(&self) -> Option<FencingToken>;
}

impl TokenSource for FencingToken {
    fn token(&self) -> Option<FencingToken> {
        Some(*self)
    }
}

impl<F: Fn() -> Option<FencingToken> + Send + Sync + 'static> TokenSource for F {
    fn token(&self) -> Option<FencingToken> {
        self()
    }
}

/// Stamps `Fencing-Token` from a [`TokenSource`] on every request.
#[derive(Clone)]
#[must_use]
pub struct FencingTokenLayer {
    source: Arc<dyn TokenSource>,
}

impl FencingTokenLayer {
    /// A layer reading tokens from `source` at each request.
    pub fn new(source: impl TokenSource) -> Self {
        FencingTokenLayer {
            source: Arc::new(source),
        }
    }
}

impl fmt::Debug for FencingTokenLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencingTokenLayer")
            .field("source", &format_args!("<source>"))
            .finish()
    }
}

/// The middleware built by [`FencingTokenLayer`].
#[derive(Clone)]
pub struct SetFencingToken<S> {
    inner: S,
    source: Arc<dyn TokenSource>,
}

impl<S: fmt::Debug> fmt::Debug for SetFencingToken<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetFencingToken")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for FencingTokenLayer {
    type Service = SetFencingToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SetFencingToken {
            inner,
            source: Arc::clone(&self.source),
        }
    }
}

impl<S, B> Service<Request<B>> for SetFencingToken<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        match self.source.token() {
            Some(token) => {
                req.headers_mut()
                    .insert(FENCING_TOKEN, HeaderValue::from(token.get()));
            }
            None => {
                req.headers_mut().remove(FENCING_TOKEN);
            }
        }
        self.inner.call(req)
    }
}
