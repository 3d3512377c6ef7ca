use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::layer::Config;
use super::observer::WriteOutcome;
use super::policy::Enforcement;
use super::rejection::{Rejection, RejectionKind};
use super::VerifiedToken;
use crate::{FencingToken, Raise, RaiseFuture};

/// A request waiting for the store's answer.
struct Pending<S, ReqBody> {
    inner: S,
    request: Request<ReqBody>,
    resource: String,
    token: FencingToken,
    enforcement: Enforcement,
    config: Arc<Config>,
}

pin_project! {
    /// The response future of [`Fence`](crate::Fence): a refusal made by the layer, or the
    /// inner service's future once the token is admitted.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Checking { check: RaiseFuture, pending: Option<Pending<S, ReqBody>> },
        Inner { #[pin] future: S::Future },
        Rejected { response: Option<S::Response> },
    }
}

impl<S: Service<Request<ReqBody>>, ReqBody> ResponseFuture<S, ReqBody> {
    pub(crate) fn inner(future: S::Future) -> Self {
        ResponseFuture {
            state: State::Inner { future },
        }
    }

    pub(crate) fn rejected(response: S::Response) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }

    pub(crate) fn checking(
        check: RaiseFuture,
        inner: S,
        request: Request<ReqBody>,
        resource: String,
        token: FencingToken,
        enforcement: Enforcement,
        config: Arc<Config>,
    ) -> Self {
        let pending = Pending {
            inner,
            request,
            resource,
            token,
            enforcement,
            config,
        };
        ResponseFuture {
            state: State::Checking {
                check,
                pending: Some(pending),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                StateProj::Inner { future } => return future.poll(cx),
                StateProj::Rejected { response } => {
                    return Poll::Ready(Ok(response.take().expect("polled after completion")))
                }
                StateProj::Checking { check, pending } => {
                    let outcome = ready!(check.as_mut().poll(cx));
                    let p = pending.take().expect("polled after completion");
                    decide(p, outcome)
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// Turns the store's answer into the next state: call the inner service, or refuse.
fn decide<S, ReqBody, ResBody>(
    p: Pending<S, ReqBody>,
    outcome: Result<Raise, crate::StoreError>,
) -> State<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    let Pending {
        mut inner,
        mut request,
        resource,
        token,
        enforcement,
        config,
    } = p;
    match verdict(&config, &mut request, resource, token, enforcement, outcome) {
        Some(response) => State::Rejected {
            response: Some(response),
        },
        None => State::Inner {
            future: inner.call(request),
        },
    }
}

/// Applies the store's answer to a request: reports it, and either returns the refusal
/// or (admitted, or advisory) marks the request with [`VerifiedToken`] when admitted and
/// returns `None` to let it through.
pub(crate) fn verdict<ReqBody, ResBody: From<Bytes>>(
    config: &Config,
    request: &mut Request<ReqBody>,
    resource: String,
    token: FencingToken,
    enforcement: Enforcement,
    outcome: Result<Raise, crate::StoreError>,
) -> Option<Response<ResBody>> {
    let (refusal, outcome, highest) = match outcome {
        Ok(Raise::Admitted) => (None, WriteOutcome::Admitted, None),
        Ok(Raise::Stale { highest }) => (
            Some(RejectionKind::StaleToken),
            WriteOutcome::Stale,
            Some(highest),
        ),
        Err(_) => (
            Some(RejectionKind::StoreUnavailable),
            WriteOutcome::StoreUnavailable,
            None,
        ),
    };
    config.observe(
        request,
        &resource,
        Some(token),
        highest,
        outcome,
        enforcement,
    );
    match (enforcement, refusal) {
        (Enforcement::Fenced, Some(kind)) => {
            let rejection = Rejection {
                kind,
                resource,
                token: Some(token),
                highest,
            };
            Some(rejection.into_response(config.respond.as_deref()))
        }
        (_, _) => {
            if outcome == WriteOutcome::Admitted {
                request
                    .extensions_mut()
                    .insert(VerifiedToken { token, resource });
            }
            None
        }
    }
}
