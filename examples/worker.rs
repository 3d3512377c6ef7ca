//! A worker that holds a lock through the lock service and writes with its fencing token.
//!
//! ```sh
//! cargo run --example worker -- --service http://127.0.0.1:8080 --identity spiffe://example.org/orders/workers/a \
//!     --lock orders/invoices/invoice-42 --target http://127.0.0.1:8081/orders/invoice-42
//! ```
//!
//! It shows the three things a lock client has to do:
//!
//! 1. open a session (the client renews it in the background) and acquire the lock;
//! 2. send the hold's token with every write: here a tower `FencingTokenLayer` adds the
//!    `Fencing-Token` header to each HTTP request, and the optional direct database write
//!    passes the token to `fenced_transaction`;
//! 3. react to the lost signal: once `hold.lost()` completes, stop writing.
//!
//! It reads commands on stdin, one a line, and answers with one JSON line each on stdout,
//! so that a script can drive it step by step:
//!
//! - `acquire`: open a session if needed and acquire the lock (prints the token);
//! - `write`: write the resource over HTTP (and to the database with `--database`),
//!   unless the hold is known to be lost;
//! - `write-in-flight`: the same without looking at the lost signal, as a write that was
//!   already under way when the process was paused would be;
//! - `release`, `quit`.
//!
//! A `{"event":"lost"}` line is printed as soon as the hold is lost (not after a
//! `release` or `quit`, which end it on purpose).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use palisade_client::{Client, ClientSession, RemoteHold};
use palisade_fence::{fenced_transaction, FenceError, FencingToken, FencingTokenLayer};
use palisade_lock::Mode;
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tower::{Service, ServiceBuilder, ServiceExt};

/// Command-line flags.
#[derive(Debug, Parser)]
struct Args {
    /// The lock service (plain HTTP, dev mode).
    #[arg(long)]
    service: String,
    /// The SPIFFE ID to act as (dev mode's identity header).
    #[arg(long)]
    identity: String,
    /// The lock: namespace/class/key.
    #[arg(long)]
    lock: String,
    /// The URL to PUT to.
    #[arg(long)]
    target: String,
    /// Also write straight to this database with `fenced_transaction`.
    #[arg(long)]
    database: Option<String>,
    /// The resource name for the direct database write (the fenced service's resource
    /// key for the same data, so both paths share one high-water mark).
    #[arg(long, default_value = "/orders/invoice-42")]
    resource: String,
    /// Session TTL in seconds.
    #[arg(long, default_value_t = 10)]
    ttl: u64,
}

fn say(v: serde_json::Value) {
    println!("{v}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut parts = args.lock.splitn(3, '/');
    let (ns, class, key) = match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(c), Some(k)) => (n.to_owned(), c.to_owned(), k.to_owned()),
        _ => return Err("--lock is namespace/class/key".into()),
    };
    let client = Client::new(args.service.clone())?.with_dev_identity(args.identity.clone());

    // The token the HTTP layer sends: whatever the current hold has.
    let current: Arc<Mutex<Option<FencingToken>>> = Arc::default();
    let source = current.clone();
    let http = ServiceBuilder::new()
        .layer(FencingTokenLayer::new(move || {
            *source.lock().expect("token lock")
        }))
        .service(HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    let db = match &args.database {
        Some(conn) => {
            let (c, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Some(c)
        }
        None => None,
    };
    let mut db = db;

    let mut session: Option<ClientSession> = None;
    let mut hold: Option<RemoteHold> = None;
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Watches the session of the current hold; stopped on a deliberate release or close,
    // which end the session's hold without anything being lost.
    let mut watcher: Option<tokio::task::JoinHandle<()>> = None;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut writes = 0_u32;
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "acquire" => {
                if session.as_ref().is_none_or(ClientSession::is_lost) {
                    session = Some(client.open_session(Duration::from_secs(args.ttl)).await?);
                }
                let s = session.as_ref().expect("just opened");
                match s
                    .acquire(&ns, &class, &key, Mode::Exclusive, Duration::from_secs(30))
                    .await
                {
                    Ok(h) => {
                        *current.lock().expect("token lock") = h.token();
                        lost.store(false, std::sync::atomic::Ordering::SeqCst);
                        // React to the lost signal: here, report it and stop writing (`write`
                        // checks the flag). A real worker would also abort work in progress.
                        let s = s.clone();
                        let flag = lost.clone();
                        if let Some(w) = watcher.take() {
                            w.abort();
                        }
                        watcher = Some(tokio::spawn(async move {
                            s.lost().await;
                            flag.store(true, std::sync::atomic::Ordering::SeqCst);
                            say(json!({"event": "lost"}));
                        }));
                        say(json!({"event": "acquired", "token": h.token().map(|t| t.get())}));
                        hold = Some(h);
                    }
                    Err(e) => say(json!({"event": "error", "error": e.to_string()})),
                }
            }
            cmd @ ("write" | "write-in-flight") => {
                if cmd == "write" && lost.load(std::sync::atomic::Ordering::SeqCst) {
                    say(json!({"event": "skipped", "reason": "hold lost"}));
                    continue;
                }
                let token = *current.lock().expect("token lock");
                writes += 1;
                let body = format!("written by {} (write {writes})", args.identity);
                // 1. Over HTTP: FencingTokenLayer adds `Fencing-Token: <token>`.
                let req = http::Request::put(&args.target)
                    .header("x-caller", &args.identity)
                    .body(Full::new(Bytes::from(body.clone())))?;
                let mut svc = http.clone();
                let (status, text) = match svc.ready().await?.call(req).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let bytes = resp.into_body().collect().await?.to_bytes();
                        (status, String::from_utf8_lossy(&bytes).into_owned())
                    }
                    Err(e) => (0, e.to_string()),
                };
                say(
                    json!({"event": "write", "via": "http", "token": token.map(|t| t.get()), "status": status, "body": text}),
                );
                // 2. Straight to the database: the check and the write in one transaction.
                if let (Some(client), Some(t)) = (db.as_mut(), token) {
                    let resource = args.resource.clone();
                    let id = key.clone();
                    let result = fenced_transaction(client, &resource, t, |tx| {
                        Box::pin(async move {
                            tx.execute(
                                "INSERT INTO invoice (id, body, token) VALUES ($1, $2, $3) \
                                 ON CONFLICT (id) DO UPDATE SET body = $2, token = $3, written_at = now()",
                                &[&id, &body, &t],
                            )
                            .await?;
                            Ok::<_, FenceError>(())
                        })
                    })
                    .await;
                    match result {
                        Ok(()) => say(
                            json!({"event": "write", "via": "postgres", "token": t.get(), "committed": true}),
                        ),
                        Err(e) => say(json!({
                            "event": "write", "via": "postgres", "token": t.get(), "committed": false,
                            "stale": e.is_stale(), "highest": e.highest().map(|h| h.get()), "error": e.to_string(),
                        })),
                    }
                }
            }
            "release" => {
                if let Some(h) = hold.take() {
                    if let Some(w) = watcher.take() {
                        w.abort();
                    }
                    let t = h.token().map(|t| t.get());
                    match h.release().await {
                        Ok(()) => say(json!({"event": "released", "token": t})),
                        Err(e) => say(json!({"event": "error", "error": e.to_string()})),
                    }
                }
            }
            "quit" => break,
            other => say(json!({"event": "error", "error": format!("unknown command {other:?}")})),
        }
    }
    if let Some(w) = watcher.take() {
        w.abort();
    }
    if let Some(s) = session {
        let _ = s.close().await;
    }
    Ok(())
}
