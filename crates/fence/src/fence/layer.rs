use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Response, Uri};
use tower::Layer;

use super::observer::WriteObserver;
use super::policy::{Enforcement, EnforcementTable};
use super::rejection::{Rejection, RespondFn};
use super::resource::decoded_path;
use super::service::Fence;
use crate::HighWaterStore;

type ResourceFn = dyn Fn(&Method, &Uri, &HeaderMap) -> Option<String> + Send + Sync;
type EnforcementFn = dyn Fn(&str) -> Enforcement + Send + Sync;
type CallerFn = dyn Fn(&HeaderMap, &Extensions) -> Option<String> + Send + Sync;

/// Everything a [`Fence`] needs, shared by its clones.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn HighWaterStore>,
    pub(crate) resource: Arc<ResourceFn>,
    pub(crate) enforcement: Arc<EnforcementFn>,
    pub(crate) methods: Vec<Method>,
    pub(crate) observer: Option<Arc<dyn WriteObserver>>,
    pub(crate) fenced_events: bool,
    pub(crate) refused_events: bool,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Option<super::metrics::FenceMetrics>,
    pub(crate) caller: Option<Arc<CallerFn>>,
    pub(crate) respond: Option<Arc<RespondFn>>,
}

/// Applies [`Fence`] to a service: refuses writes whose fencing token is missing,
/// malformed or stale. See the [module docs](crate::fence) for the exact behaviour.
#[derive(Clone)]
#[must_use]
pub struct FenceLayer {
    config: Config,
}

impl FenceLayer {
    /// Checks `POST`, `PUT`, `PATCH` and `DELETE` requests against `store`, with the
    /// percent-decoded request path ([`decoded_path`](crate::decoded_path)) as the
    /// resource key and every resource [`Enforcement::Fenced`].
    pub fn new(store: impl HighWaterStore) -> Self {
        FenceLayer {
            config: Config {
                store: Arc::new(store),
                resource: Arc::new(|_: &Method, uri: &Uri, _: &HeaderMap| Some(decoded_path(uri))),
                enforcement: Arc::new(|_: &str| Enforcement::Fenced),
                methods: vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
                observer: None,
                fenced_events: false,
                refused_events: false,
                #[cfg(feature = "metrics")]
                metrics: None,
                caller: None,
                respond: None,
            },
        }
    }

    /// Maps a request to its resource key; `None` lets the request through unchecked.
    ///
    /// The mapping must agree with how the inner service routes: two requests that
    /// reach the same data must map to the same key, or each key keeps its own mark and a
    /// stale token passes through the other. Build keys from decoded values, as
    /// [`decoded_path`](crate::decoded_path) does.
    pub fn with_resource<F>(mut self, f: F) -> Self
    where
        F: Fn(&Method, &Uri, &HeaderMap) -> Option<String> + Send + Sync + 'static,
    {
        self.config.resource = Arc::new(f);
        self
    }

    /// Resolves each resource's enforcement with a closure.
    pub fn with_enforcement<F>(mut self, f: F) -> Self
    where
        F: Fn(&str) -> Enforcement + Send + Sync + 'static,
    {
        self.config.enforcement = Arc::new(f);
        self
    }

    /// Resolves each resource's enforcement with a prefix table.
    pub fn with_enforcement_table(self, table: EnforcementTable) -> Self {
        self.with_enforcement(move |resource| table.resolve(resource))
    }

    /// Checks requests with these methods (replacing the default write methods).
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Builds refusals with `respond` instead of the problem document (for example, to
    /// match an API's own error format). The [`Rejection`] is still put in the response
    /// extensions.
    pub fn with_rejection_response<F>(mut self, respond: F) -> Self
    where
        F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.config.respond = Some(Arc::new(respond));
        self
    }

    /// Reports writes to advisory resources to `observer` (and, with
    /// [`with_fenced_events`](Self::with_fenced_events), writes to fenced resources too).
    pub fn with_observer(mut self, observer: impl WriteObserver) -> Self {
        self.config.observer = Some(Arc::new(observer));
        self
    }

    /// Also reports writes to fenced resources, admitted and refused, to the observer
    /// (by default only advisory writes are reported).
    pub fn with_fenced_events(mut self) -> Self {
        self.config.fenced_events = true;
        self
    }

    /// Also reports writes the layer refuses (fenced resources: a missing, malformed or
    /// stale token, or the store unavailable) to the observer, without the admitted
    /// fenced writes that [`with_fenced_events`](Self::with_fenced_events) adds. Refusals
    /// are rare (a stale writer, a caller without tokens), so this costs a queue slot per
    /// refusal, not per write.
    pub fn with_refused_events(mut self) -> Self {
        self.config.refused_events = true;
        self
    }

    /// Counts every checked write in `metrics` (admitted, refused by reason,
    /// unprotected by finding), whether or not an observer is set. Clones share counters.
    #[cfg(feature = "metrics")]
    pub fn with_metrics(mut self, metrics: &super::metrics::FenceMetrics) -> Self {
        self.config.metrics = Some(metrics.clone());
        self
    }

    /// Names the caller of each reported write ([`WriteEvent::caller`](crate::WriteEvent::caller))
    /// from the request's headers and extensions, for example the mTLS peer's SPIFFE ID put
    /// in the extensions by the TLS acceptor. Called only when an event is reported.
    pub fn with_caller<F>(mut self, f: F) -> Self
    where
        F: Fn(&HeaderMap, &Extensions) -> Option<String> + Send + Sync + 'static,
    {
        self.config.caller = Some(Arc::new(f));
        self
    }
}

impl fmt::Debug for FenceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceLayer")
            .field("store", &format_args!("<store>"))
            .field("resource", &format_args!("<fn>"))
            .field("enforcement", &format_args!("<fn>"))
            .field("methods", &self.config.methods)
            .field(
                "observer",
                &self
                    .config
                    .observer
                    .as_ref()
                    .map(|_| format_args!("<observer>")),
            )
            .field("fenced_events", &self.config.fenced_events)
            .field("refused_events", &self.config.refused_events)
            .field(
                "caller",
                &self.config.caller.as_ref().map(|_| format_args!("<fn>")),
            )
            .field(
                "rejection_response",
                &self.config.respond.as_ref().map(|_| format_args!("<fn>")),
            )
            .finish()
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fence<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fence::new(inner, Arc::new(self.config.clone()))
    }
}
