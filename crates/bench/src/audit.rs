//! The audit dashboard at scale: the unprotected-writes page and its JSON over HTTP on
//! loopback, with N write events in the audit database.
//!
//! Events are spread evenly over the last 7 days, one in five unprotected (by finding:
//! missing, malformed, stale in turn), one in a hundred refused (stale), the rest
//! admitted, over 100 services, 10,000 resources, 50 callers and 10 namespaces (event
//! `i` has service `svc-<i % 100>` and resource `orders/<i % 10000>`, so the filtered
//! URLs below match unprotected rows). Each
//! URL is fetched `requests` times in turn over one keep-alive connection; the table has
//! the latency quantiles.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use palisade_audit::{insert_writes, Finding, Labels, Outcome, WriteRecord};
use palisade_testkit::TestDb;
use tokio::time::Instant;

use crate::error::{BenchError, Result};
use crate::report::{f, histogram, record, Table};

/// The URLs measured, in the order they take turns.
pub(crate) const URLS: [&str; 10] = [
    "/",
    "/?range=7d",
    "/api/overview",
    "/api/overview?range=7d",
    "/refused",
    "/unprotected",
    "/api/unprotected",
    "/api/unprotected?service=svc-5",
    "/api/unprotected?resource=orders%2F4240",
    "/api/unprotected/hourly",
];

/// Fills a fresh audit database with `events` write events, serves the dashboard and
/// times `requests` fetches of each URL.
pub(crate) async fn run(events: usize, requests: usize) -> Result<Table> {
    let db = TestDb::create().await;
    let pool = palisade_audit::pool(&db.connection_string(), 4)?;
    palisade_audit::migrate(&pool).await?;
    let client = pool
        .get()
        .await
        .map_err(|_| BenchError::Unexpected("no audit connection"))?;
    let now = SystemTime::now();
    let week = Duration::from_secs(7 * 24 * 3600);
    let t0 = Instant::now();
    const BATCH: usize = 10_000;
    let mut done = 0;
    while done < events {
        let n = BATCH.min(events - done);
        let batch: Vec<WriteRecord> = (done..done + n)
            .map(|i| {
                let unprotected = i % 5 == 0;
                let (outcome, finding) = if unprotected {
                    let finding = [
                        Finding::MissingToken,
                        Finding::MalformedToken,
                        Finding::Stale,
                    ][(i / 5) % 3];
                    (Outcome::Unprotected, finding)
                } else if i % 100 == 1 {
                    (Outcome::Rejected, Finding::Stale)
                } else {
                    (Outcome::Admitted, Finding::Current)
                };
                let at = now - week.mul_f64(1.0 - i as f64 / events as f64);
                let mut r = WriteRecord::new(
                    format!("svc-{}", i % 100),
                    format!("orders/{}", i % 10_000),
                    "PUT",
                    outcome,
                    finding,
                    at,
                );
                r.fenced = Some(!unprotected);
                if finding == Finding::Stale {
                    r.token =
                        Some(palisade_fence::FencingToken::from_u64(1 << 48).expect("a token"));
                    r.highest = Some(
                        palisade_fence::FencingToken::from_u64((1 << 48) + 7).expect("a token"),
                    );
                }
                r.labels = Labels::new(format!("ns{}", i % 10), "rows");
                r.caller = Some(format!("spiffe://bench/caller-{}", i % 50));
                r
            })
            .collect();
        insert_writes(&**client, &batch).await?;
        done += n;
        if done % 200_000 == 0 {
            eprintln!("audit: {done} events inserted");
        }
    }
    // What autovacuum does to an insert-only table in time (visibility map, statistics).
    client.batch_execute("VACUUM ANALYZE write_event").await?;
    eprintln!(
        "audit: {events} events in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    drop(client);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = palisade_audit::dashboard::router(pool);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut conn = connect(addr).await?;
    let mut hists: Vec<_> = URLS.iter().map(|_| histogram()).collect();
    let mut sizes = vec![0usize; URLS.len()];
    for _ in 0..requests.max(1) {
        for (u, url) in URLS.iter().enumerate() {
            let t = Instant::now();
            let body = get(&mut conn, url).await?;
            record(&mut hists[u], t.elapsed());
            sizes[u] = body.len();
        }
    }
    server.abort();
    let mut table = Table::new(
        format!(
            "Audit dashboard with {events} write events ({} unprotected over 7 days), {requests} fetches per URL, one connection (target: p99 under 50 ms)",
            events.div_ceil(5)
        ),
        &["URL", "p50 ms", "p99 ms", "max ms", "bytes", "p99 < 50 ms"],
    );
    for (u, url) in URLS.iter().enumerate() {
        let h = &hists[u];
        let p99 = h.value_at_quantile(0.99) as f64 / 1_000.0;
        table.row(vec![
            format!("`{url}`"),
            f(h.value_at_quantile(0.5) as f64 / 1_000.0, 2),
            f(p99, 2),
            f(h.max() as f64 / 1_000.0, 2),
            sizes[u].to_string(),
            if p99 < 50.0 { "yes" } else { "no" }.to_owned(),
        ]);
    }
    Ok(table)
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn get(sender: &mut Sender, path: &str) -> Result<Bytes> {
    let req = http::Request::get(path)
        .header(http::header::HOST, "bench")
        .body(Empty::<Bytes>::new())
        .map_err(|_| BenchError::Unexpected("request did not build"))?;
    sender.ready().await?;
    let res = sender.send_request(req).await?;
    if res.status() != http::StatusCode::OK {
        return Err(BenchError::Unexpected(
            "a dashboard URL was not answered 200",
        ));
    }
    Ok(res.into_body().collect().await?.to_bytes())
}
