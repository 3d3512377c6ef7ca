//! What every request passes through before the caller's service: the body stall bound,
//! the peer address, the count of requests in flight, and the probe reserve's filter.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body::Frame;
use hyper::body::Incoming;
use tower_http::timeout::TimeoutBody;

/// A boxed error, as hyper and axum take them.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The caller's service `S` on one connection.
#[derive(Clone)]
pub(crate) struct ConnService<S> {
    pub(crate) inner: S,
    pub(crate) peer: SocketAddr,
    pub(crate) busy: Arc<AtomicUsize>,
    pub(crate) body_stall: Duration,
    /// On the probe reserve: the paths answered; every other gets 503.
    pub(crate) probes_only: Option<Arc<[String]>>,
}

impl<S, B> tower::Service<Request<Incoming>> for ConnService<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        if let Some(paths) = &self.probes_only {
            if !paths.iter().any(|p| p == req.uri().path()) {
                return Box::pin(std::future::ready(Ok(at_capacity())));
            }
        }
        let in_flight = InFlight::new(&self.busy);
        let (parts, body) = req.into_parts();
        let mut req =
            Request::from_parts(parts, Body::new(TimeoutBody::new(self.body_stall, body)));
        req.extensions_mut().insert(ConnectInfo(self.peer));
        // The service that was polled ready serves this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(req).await.map_err(Into::into)?;
            // In flight until the response body is written out or dropped.
            Ok(response.map(|b| Body::new(Tracked { body: b, in_flight })))
        })
    }
}

/// The answer on the probe reserve to anything but a probe.
fn at_capacity() -> Response<Body> {
    let mut response = Response::new(Body::from(
        "the server is at its connection limit: retry shortly\n",
    ));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// One request in flight on a connection; a connection with one is never evicted.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(busy: &Arc<AtomicUsize>) -> InFlight {
        busy.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(busy))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted in flight until it ends or is
    /// dropped.
    struct Tracked<B> {
        #[pin]
        body: B,
        in_flight: InFlight,
    }
}

impl<B> http_body::Body for Tracked<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
