//! The proxy's request path: normalize the path, pick the route, refuse what the route
//! does not allow (an upgrade where writes are checked), then the route's service: the
//! forwarder behind the fence's own [`Fence`] for checked routes, the forwarder alone
//! for open ones. There is no second implementation of the check.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use arc_swap::ArcSwap;
use axum::body::Body;
use http::{HeaderName, Request, Response, Uri};
use palisade_fence::{
    Enforcement, Fence, FenceLayer, HighWaterStore, VerifiedToken, WriteEvent, WriteOutcome,
};
use tower::{Layer, Service, ServiceExt};

use crate::config::ProxyConfig;
use crate::forward::{upgrade_of, Forwarder};
use crate::metrics::{verdict, ProxyMetrics, RouteCounters};
use crate::problem::ProxyProblem;
use crate::route::{normalize, Policy, Route, RouteTable};

/// The method-override headers frameworks obey (Rails, Symfony, Express, ASP.NET).
const METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Where refused and unprotected writes are reported (the audit sink's observer).
pub(crate) type Reporter = Arc<dyn Fn(WriteEvent) + Send + Sync>;

/// A route's forwarder: counts what reaches it (admitted by the fence, or not checked),
/// then forwards. Refusals never reach it; the fence's observer counts them.
#[derive(Clone)]
struct RouteForwarder {
    forwarder: Forwarder,
    route: Arc<Route>,
    counters: RouteCounters,
}

impl Service<Request<Body>> for RouteForwarder {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if req.extensions().get::<VerifiedToken>().is_some() {
            self.counters.admitted.inc();
        } else if !self.route.checks(req.method()) {
            self.counters.unchecked.inc();
        }
        let forwarder = self.forwarder.clone();
        Box::pin(async move { Ok(forwarder.forward(req).await) })
    }
}

/// One route's service.
#[derive(Clone)]
enum RouteService {
    Open(RouteForwarder),
    Checked(Fence<RouteForwarder>),
}

/// What one config serves: its routes, their services and series; replaced whole on
/// reload.
pub(crate) struct Routing {
    table: RouteTable,
    services: Vec<RouteService>,
    counters: Vec<RouteCounters>,
}

impl Routing {
    /// The services of `config`'s routes, forwarding to its upstream within its
    /// timeouts and checking against `store`.
    pub(crate) fn of(
        config: &ProxyConfig,
        store: &Arc<dyn HighWaterStore>,
        metrics: &ProxyMetrics,
        report: Option<&Reporter>,
    ) -> Routing {
        let forwarder = Forwarder::new(
            &config.upstream,
            config.timeouts.connect,
            config.timeouts.upstream,
        );
        Routing::new(config.routes.clone(), &forwarder, store, metrics, report)
    }

    /// The services of `table`'s routes over `forwarder`, checking against `store`.
    fn new(
        table: RouteTable,
        forwarder: &Forwarder,
        store: &Arc<dyn HighWaterStore>,
        metrics: &ProxyMetrics,
        report: Option<&Reporter>,
    ) -> Routing {
        let counters: Vec<RouteCounters> = table
            .routes()
            .iter()
            .map(|route| metrics.route(route.label()))
            .collect();
        let services = table
            .routes()
            .iter()
            .zip(&counters)
            .map(|(route, c)| {
                let forward = RouteForwarder {
                    forwarder: forwarder.clone(),
                    route: Arc::new(route.clone()),
                    counters: c.clone(),
                };
                route_service(route, forward, store, metrics, report)
            })
            .collect();
        Routing {
            table,
            services,
            counters,
        }
    }
}

fn route_service(
    route: &Route,
    forward: RouteForwarder,
    store: &Arc<dyn HighWaterStore>,
    metrics: &ProxyMetrics,
    report: Option<&Reporter>,
) -> RouteService {
    let enforcement = match route.policy {
        Policy::Open => return RouteService::Open(forward),
        Policy::Fenced => Enforcement::Fenced,
        Policy::Advisory => Enforcement::Advisory,
    };
    let label = route.label().to_owned();
    let counting = metrics.clone();
    let report = report.cloned();
    let resource_route = route.clone();
    let layer = FenceLayer::new(Arc::clone(store))
        .with_methods(route.methods.clone())
        // The proxy has put the normalized path in the URI by now.
        .with_resource(move |_, uri, _| resource_route.resource_of(uri.path()))
        .with_enforcement(move |_| enforcement)
        // Refusals, and every advisory write; admitted writes are counted where they
        // arrive (RouteForwarder), without an event each.
        .with_refused_events()
        .with_observer(move |event: WriteEvent| {
            if event.outcome != WriteOutcome::Admitted {
                counting.count(&label, verdict(event.outcome, event.enforcement));
            }
            if event.unprotected || event.rejected {
                if let Some(report) = &report {
                    report(event);
                }
            }
        });
    RouteService::Checked(layer.layer(forward))
}

/// The proxy's tower service; clones share the routing, which a reload swaps.
#[derive(Clone)]
pub(crate) struct ProxyService {
    pub(crate) routing: Arc<ArcSwap<Routing>>,
    pub(crate) metrics: ProxyMetrics,
}

impl Service<Request<Body>> for ProxyService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let routing = self.routing.load_full();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let started = Instant::now();
            let path = match normalize(req.uri().path()) {
                Ok(p) => p.into_owned(),
                Err(e) => {
                    metrics.count("default", ProxyProblem::BadPath.label());
                    return Ok(ProxyProblem::BadPath.response(e.to_string(), None));
                }
            };
            if path != req.uri().path() {
                let mut target = path.clone();
                if let Some(q) = req.uri().query() {
                    target.push('?');
                    target.push_str(q);
                }
                let mut parts = req.uri().clone().into_parts();
                parts.path_and_query = target.parse().ok();
                let Ok(uri) = Uri::from_parts(parts) else {
                    // Never on with the raw path: it could map to no resource.
                    metrics.count("default", ProxyProblem::BadPath.label());
                    return Ok(ProxyProblem::BadPath
                        .response("the normalized path is not a request target".into(), None));
                };
                *req.uri_mut() = uri;
            }
            let i = routing.table.find(&path);
            let route = &routing.table.routes()[i];
            let label = route.label();
            if let Some(protocol) = upgrade_of(req.headers(), req.version()) {
                let refused = if route.policy != Policy::Open {
                    Some(format!(
                        "{path} is on a {} route ({label}): an upgraded connection would carry writes the fence cannot check; only open routes pass upgrades",
                        route.policy
                    ))
                } else if !protocol.as_bytes().eq_ignore_ascii_case(b"websocket") {
                    // h2c and the like would tunnel requests past every route.
                    Some(format!(
                        "only websocket upgrades pass, not {:?}: another protocol would carry requests past the fence",
                        String::from_utf8_lossy(protocol.as_bytes())
                    ))
                } else {
                    None
                };
                if let Some(detail) = refused {
                    metrics.count(label, ProxyProblem::UpgradeRefused.label());
                    return Ok(ProxyProblem::UpgradeRefused.response(detail, None));
                }
            }
            if route.refuses(req.method()) {
                metrics.count(label, ProxyProblem::MethodNotChecked.label());
                return Ok(ProxyProblem::MethodNotChecked.response(
                    format!(
                        "{} is neither checked on the fenced route {label} nor a safe method: list it in the route's methods",
                        req.method()
                    ),
                    None,
                ));
            }
            if route.policy == Policy::Fenced {
                if let Some(name) = METHOD_OVERRIDES
                    .iter()
                    .find(|h| req.headers().contains_key(*h))
                {
                    metrics.count(label, ProxyProblem::MethodOverride.label());
                    return Ok(ProxyProblem::MethodOverride.response(
                        format!(
                            "{name} is refused on the fenced route {label}: frameworks obey it after the fence checked the method"
                        ),
                        None,
                    ));
                }
            }
            let response = match routing.services[i].clone() {
                RouteService::Open(f) => f.oneshot(req).await,
                RouteService::Checked(f) => f.oneshot(req).await,
            };
            let Ok(response) = response;
            routing.counters[i]
                .duration
                .observe(started.elapsed().as_secs_f64());
            if let Some(problem) = response.extensions().get::<ProxyProblem>() {
                if problem.on_the_way() {
                    metrics.forward_failed(label, problem.label());
                }
            }
            Ok(response)
        })
    }
}
