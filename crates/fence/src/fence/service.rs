use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use tower::Service;

use super::future::{verdict, ResponseFuture};
use super::layer::Config;
use super::observer::{WriteEvent, WriteOutcome};
use super::policy::Enforcement;
use super::rejection::{Rejection, RejectionKind};
use super::FENCING_TOKEN;
use crate::FencingToken;

/// The middleware built by [`FenceLayer`](crate::FenceLayer).
#[derive(Clone)]
pub struct Fence<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Fence<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        Fence { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Fence<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("inner", &self.inner)
            .field("methods", &self.config.methods)
            .finish()
    }
}

/// The `Fencing-Token` header: absent, one well-formed token, or anything else.
///
/// One value that is empty after trimming the optional whitespace HTTP allows around a
/// field value carries no token: it reads as absent (a missing token, 428 when fenced),
/// not as malformed. Two values, even if one is empty, are malformed.
fn read_token(headers: &HeaderMap) -> Result<Option<FencingToken>, ()> {
    let mut values = headers.get_all(&FENCING_TOKEN).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(());
    }
    let trimmed = value.as_bytes().trim_ascii();
    if trimmed.is_empty() {
        return Ok(None);
    }
    FencingToken::parse_bytes(trimmed).map(Some).map_err(|_| ())
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Fence<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let config = &self.config;
        if !config.methods.contains(req.method()) {
            return ResponseFuture::inner(self.inner.call(req));
        }
        let Some(resource) = (config.resource)(req.method(), req.uri(), req.headers()) else {
            return ResponseFuture::inner(self.inner.call(req));
        };
        let enforcement = (config.enforcement)(&resource);
        let unchecked = match read_token(req.headers()) {
            Ok(Some(token)) => {
                // A store that decides at once (in process): no boxed future, no clone of
                // the inner service; the readied service is called right here.
                if let Some(outcome) = config.store.raise_ready(&resource, token) {
                    let mut req = req;
                    return match verdict(config, &mut req, resource, token, enforcement, outcome) {
                        Some(refusal) => ResponseFuture::rejected(refusal),
                        None => ResponseFuture::inner(self.inner.call(req)),
                    };
                }
                let check = config.store.raise(&resource, token);
                // The readied service goes into the future; a clone stays for the next call.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                return ResponseFuture::checking(
                    check,
                    inner,
                    req,
                    resource,
                    token,
                    enforcement,
                    Arc::clone(config),
                );
            }
            Ok(None) => (RejectionKind::MissingToken, WriteOutcome::MissingToken),
            Err(()) => (RejectionKind::MalformedToken, WriteOutcome::MalformedToken),
        };
        config.observe(&req, &resource, None, None, unchecked.1, enforcement);
        match enforcement {
            Enforcement::Fenced => ResponseFuture::rejected(
                Rejection {
                    kind: unchecked.0,
                    resource,
                    token: None,
                    highest: None,
                }
                .into_response(config.respond.as_deref()),
            ),
            Enforcement::Advisory => ResponseFuture::inner(self.inner.call(req)),
        }
    }
}

impl Config {
    /// Counts one checked write (with metrics) and reports it, when an observer wants
    /// writes of this enforcement and outcome.
    pub(crate) fn observe<B>(
        &self,
        request: &Request<B>,
        resource: &str,
        token: Option<FencingToken>,
        highest: Option<FencingToken>,
        outcome: WriteOutcome,
        enforcement: Enforcement,
    ) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.count(outcome, enforcement);
        }
        let Some(observer) = &self.observer else {
            return;
        };
        let refused = outcome != WriteOutcome::Admitted;
        if enforcement == Enforcement::Fenced
            && !(self.fenced_events || (self.refused_events && refused))
        {
            return;
        }
        let caller = self
            .caller
            .as_ref()
            .and_then(|f| f(request.headers(), request.extensions()));
        let event = WriteEvent::new(
            resource.to_owned(),
            request.method().clone(),
            token,
            highest,
            outcome,
            enforcement,
            caller,
        );
        observer.observe(event);
    }
}
