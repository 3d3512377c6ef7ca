//! The competitors of Palisade's lock on the same etcd: etcd's own lock service (v3lock,
//! `Lock`/`Unlock` RPCs), the concurrency-mutex recipe of etcd's Go client done by hand,
//! and the raw acquire-shaped Txn; and etcd's own count of the RPCs it served.

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, LockOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::error::{BenchError, Result};

/// One v3lock cycle: `Lock` (the server enqueues, waits and grants) then `Unlock`.
pub(crate) async fn v3lock_cycle(client: &mut Client, name: &str, lease: i64) -> Result<()> {
    let locked = client
        .lock(name, Some(LockOptions::new().with_lease(lease)))
        .await?;
    client.unlock(locked.key().to_vec()).await?;
    Ok(())
}

/// One cycle of the Go client's `concurrency.Mutex`, by hand: one Txn puts this session's
/// key under the lock's prefix (if absent) and reads the first key by create revision;
/// if that is not ours, wait for the deletion of the key created just before ours
/// (watch one key, no thundering herd), repeat; then delete our key.
pub(crate) async fn recipe_cycle(client: &mut Client, prefix: &str, lease: i64) -> Result<()> {
    let my_key = format!("{prefix}{lease:016x}");
    let owner = || {
        TxnOp::get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    };
    let txn = Txn::new()
        .when([Compare::create_revision(
            my_key.as_str(),
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(
                my_key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease)),
            ),
            owner(),
        ])
        .or_else([TxnOp::get(my_key.as_str(), None), owner()]);
    let resp = client.txn(txn).await?;
    let ops = resp.op_responses();
    let my_rev = if resp.succeeded() {
        resp.header()
            .map(|h| h.revision())
            .ok_or(BenchError::Unexpected("txn without header"))?
    } else {
        match ops.first() {
            Some(TxnOpResponse::Get(g)) => {
                g.kvs().first().map(|kv| kv.create_revision()).unwrap_or(0)
            }
            _ => 0,
        }
    };
    let owner_rev = match ops.get(1) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    };
    if owner_rev != Some(my_rev) {
        // Wait until no key created before ours is left.
        loop {
            let before = client
                .get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(my_rev - 1)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(1),
                    ),
                )
                .await?;
            let Some(last) = before.kvs().first() else {
                break;
            };
            let rev = before.header().map(|h| h.revision()).unwrap_or(0);
            let (mut watcher, mut stream) = client
                .watch(
                    last.key().to_vec(),
                    Some(WatchOptions::new().with_start_revision(rev + 1)),
                )
                .await?;
            'wait: while let Some(msg) = stream.message().await? {
                if msg
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    break 'wait;
                }
            }
            let _ = watcher.cancel().await;
        }
    }
    client.delete(my_key.as_str(), None).await?;
    Ok(())
}

/// One raw acquire-shaped Txn on a client's own key: if absent, put it on the lease,
/// else delete it. Every Txn writes (a put, then a delete), as a grant and a release do.
pub(crate) async fn raw_txn(client: &mut Client, key: &str, lease: i64) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::delete(key, None)]);
    client.txn(txn).await?;
    Ok(())
}

/// Unary gRPC calls etcd has answered (any method, any code), summed over `endpoints`,
/// from etcd's own Prometheus counters (`grpc_server_handled_total`) at `/metrics`.
pub(crate) async fn unary_calls(endpoints: &[String]) -> Result<u64> {
    let mut total = 0u64;
    for e in endpoints {
        let text = get_text(e, "/metrics").await?;
        for line in text.lines() {
            if line.starts_with("grpc_server_handled_total{")
                && line.contains("grpc_type=\"unary\"")
            {
                let value = line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
                total += value as u64;
            }
        }
    }
    Ok(total)
}

/// `GET <path>` from `http://host:port` (an etcd client URL), as text.
async fn get_text(endpoint: &str, path: &str) -> Result<String> {
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let stream = tokio::net::TcpStream::connect(authority).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, authority)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|_| BenchError::Unexpected("request did not build"))?;
    let body = sender
        .send_request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}
