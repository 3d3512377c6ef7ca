//! Shared helpers: tokens, shuffles, servers on 127.0.0.1:0, an HTTP client.

use std::net::SocketAddr;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_fence::{Epoch, FencingToken, Revision};

/// A deadpool of `size` connections to `config`'s database (no TLS).
pub(crate) fn pool(config: tokio_postgres::Config, size: usize) -> deadpool_postgres::Pool {
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    deadpool_postgres::Pool::builder(manager)
        .max_size(size)
        .build()
        .unwrap()
}

pub(crate) fn tok(rev: u64) -> FencingToken {
    FencingToken::from_parts(Epoch::new(1).unwrap(), Revision::new(rev)).unwrap()
}

/// A deterministic Fisher-Yates shuffle (xorshift).
pub(crate) fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut s = seed | 1;
    for i in (1..items.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        items.swap(i, (s % (i as u64 + 1)) as usize);
    }
}

/// When writer `token` starts in a staggered run: in token order, `step_ms` apart, plus up
/// to four steps of jitter, so neighbours race and arrive out of order while many still
/// commit.
pub(crate) fn stagger(
    tokens: &[FencingToken],
    token: FencingToken,
    step_ms: u64,
    seed: u64,
) -> std::time::Duration {
    let rank = tokens.iter().filter(|t| **t < token).count() as u64;
    let mut s = (seed ^ token.get()).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    s ^= s >> 29;
    std::time::Duration::from_millis(rank * step_ms + s % (4 * step_ms + 1))
}

/// Seconds a writer pauses between its check and its write: 0 to 6 ms, by token, so
/// that a later writer would overtake an earlier one if the check did not hold the lock.
pub(crate) fn pause(token: FencingToken) -> f64 {
    (token.get().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61) as f64 * 0.001 * 6.0 / 7.0
}

/// Serves `app` on a free loopback port.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }
}

pub(crate) async fn send(
    client: &HttpClient,
    method: Method,
    addr: SocketAddr,
    path: &str,
    tokens: &[&str],
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for t in tokens {
        req = req.header("fencing-token", *t);
    }
    let res = client
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// Response body type check: axum's Body is what the layer produces under Router.
#[allow(dead_code)]
pub(crate) fn _body_is_axum(_: Body) {}
