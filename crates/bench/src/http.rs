//! The fence layer over HTTP: one axum service bare, behind `FenceLayer` with a
//! `MemoryStore`, and behind `FenceLayer` with a `PostgresStore` (on a pool, on one
//! connection, and on a pool with prepared statements), loaded by N keep-alive HTTP/1.1 connections over loopback (a hyper client
//! in this process).
//!
//! The servers run on their own one-thread runtime (one core, as a small service would)
//! and the load on the main runtime. Every request is a `PUT /r/<resource>` with the
//! token of the current hold: each connection writes its own resources, all with one
//! token, so after the first write of a resource the layer's check is a read that finds
//! the token equal to the mark (the steady state of a holder that writes many times).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::put;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use palisade_fence::{migrate, FenceLayer, FencingToken, MemoryStore, PostgresStore};
use palisade_testkit::TestDb;
use tokio::sync::Mutex;

use crate::drive::{interleave, Op};
use crate::error::{BenchError, Result};
use crate::report::{f, ratio, Table};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct HttpArgs {
    pub(crate) connections: usize,
    pub(crate) resources_per_connection: usize,
    pub(crate) secs: Duration,
    pub(crate) rounds: usize,
    pub(crate) pg_pool: usize,
}

const VARIANTS: [&str; 5] = [
    "bare axum",
    "FenceLayer + MemoryStore",
    "FenceLayer + PostgresStore (pool)",
    "FenceLayer + PostgresStore (1 connection)",
    "FenceLayer + PostgresStore (pool, prepared statements)",
];
const TARGETS: [&str; 5] = ["", ">= 0.97x", ">= 0.6x", "", ">= 0.6x"];

/// Starts the servers, runs the comparison, returns its table.
pub(crate) async fn run(args: &HttpArgs) -> Result<Table> {
    let db = TestDb::create().await;
    let mut setup = db.connect().await;
    migrate(&mut setup).await?;
    let store_client = Arc::new(db.connect().await);
    let pool = || {
        deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
            db.config(),
            tokio_postgres::NoTls,
        ))
        .max_size(args.pg_pool.max(1))
        .build()
        .map_err(|_| BenchError::Unexpected("the Postgres pool did not build"))
    };

    // The servers' runtime: one worker thread, kept alive until the bench ends.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let handler = || put(|| async { "ok" });
    let bare = Router::new().route("/r/{id}", handler());
    let memory = Router::new()
        .route("/r/{id}", handler())
        .route_layer(FenceLayer::new(MemoryStore::new(1_000_000)));
    let pooled_store = PostgresStore::from_pool(pool()?);
    let prepared_store = PostgresStore::from_pool(pool()?).with_prepared_statements();
    let single_store = PostgresStore::new(Arc::clone(&store_client));
    let pooled = Router::new()
        .route("/r/{id}", handler())
        .route_layer(FenceLayer::new(pooled_store.clone()));
    let single = Router::new()
        .route("/r/{id}", handler())
        .route_layer(FenceLayer::new(single_store.clone()));
    let prepared = Router::new()
        .route("/r/{id}", handler())
        .route_layer(FenceLayer::new(prepared_store.clone()));
    let mut addrs = Vec::new();
    for app in [bare, memory, pooled, single, prepared] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        addrs.push(listener.local_addr()?);
        server_rt.spawn(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                let _ = axum::serve(listener, app).await;
            }
        });
    }

    let token = FencingToken::from_u64(1 << 48)
        .unwrap_or(FencingToken::MIN)
        .to_string();
    let mut variants: Vec<Vec<Op>> = Vec::new();
    for &addr in &addrs {
        let mut ops = Vec::with_capacity(args.connections);
        for i in 0..args.connections {
            let paths: Vec<String> = (0..args.resources_per_connection.max(1))
                .map(|k| format!("/r/c{i}-{k}"))
                .collect();
            ops.push(connection(addr, paths, token.clone()).await?);
        }
        variants.push(ops);
    }
    eprintln!("fence-layer: {} connections", args.connections);
    let run = interleave(variants, args.rounds, args.secs).await?;
    let mut table = Table::new(
        format!(
            "Fence layer over HTTP: {} connections on loopback, server on one thread, PostgresStore pool of {} ({} s x {} rounds per variant; ratio = median of per-round ratios)",
            args.connections,
            args.pg_pool,
            args.secs.as_secs_f64(),
            args.rounds
        ),
        &[
            "variant",
            "req/s",
            "p50 ms",
            "p99 ms",
            "vs bare",
            "target",
            "raises per batch",
        ],
    );
    let per_batch = |store: &PostgresStore| {
        let counts = store.batch_counts();
        f(counts.raises as f64 / counts.batches.max(1) as f64, 1)
    };
    let batches = [
        String::new(),
        String::new(),
        per_batch(&pooled_store),
        per_batch(&single_store),
        per_batch(&prepared_store),
    ];
    for (v, s) in run.merged.iter().enumerate() {
        table.row(vec![
            VARIANTS[v].to_owned(),
            f(s.rate(), 0),
            f(s.ms(0.5), 2),
            f(s.ms(0.99), 2),
            ratio(run.ratio(v, 0)),
            TARGETS[v].to_owned(),
            batches[v].clone(),
        ]);
    }
    server_rt.shutdown_background();
    Ok(table)
}

/// One keep-alive connection to `addr` that writes `paths` in turn with `token`.
pub(crate) async fn connection(addr: SocketAddr, paths: Vec<String>, token: String) -> Result<Op> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let sender = Arc::new(Mutex::new(sender));
    let mut next = 0usize;
    Ok(Box::new(move || {
        let path = paths[next % paths.len()].clone();
        next += 1;
        let (sender, token) = (Arc::clone(&sender), token.clone());
        Box::pin(async move {
            let req = http::Request::put(path)
                .header(http::header::HOST, "bench")
                .header("fencing-token", token)
                .body(Empty::<Bytes>::new())
                .map_err(|_| BenchError::Unexpected("request did not build"))?;
            let mut s = sender.lock().await;
            s.ready().await?;
            let res = s.send_request(req).await?;
            let status = res.status();
            res.into_body().collect().await?;
            if status == http::StatusCode::OK {
                Ok(())
            } else {
                Err(BenchError::Unexpected("a write was not answered 200"))
            }
        })
    }))
}
