//! A few etcd watch streams per locker, shared by every lock watch of its waiters (see
//! [`crate::lock_watch`]).
//!
//! etcd serves any number of watches on one `Watch` gRPC stream: each create request
//! names its watch (`WatchCreateRequest.watch_id`, etcd 3.4+), and every response on the
//! stream carries the id of the watch it is for. So [`STREAMS`] streams are opened once
//! per locker, each watch is added to one of them in turn and cancelled when it is done,
//! and no wait pays a stream set-up (two goroutines and a watch stream in etcd). More
//! than one stream, because every message of a stream goes through one sender in etcd
//! and one reader here (BENCHMARKS.md, section 4, has the measurements).
//!
//! A stream is opened lazily by the first watch given to it, with a first watch on the epoch key
//! (etcd-client opens a stream only together with a watch; that key is written only when
//! the epoch advances, and its events are ignored). When the stream fails or ends (a
//! member went away, it lost its leader: the client sends etcd's require-leader
//! metadata, so a member without a leader ends the stream), every open
//! [`Subscription`] on it ends (its [`Subscription::next`] returns `None`), and the next
//! subscription given that stream's place opens a new one.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ResponseHeader, WatchOptions, WatchResponse, WatchStream, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The error of a stream that failed, or did not confirm a watch in time, or
/// cancelled it at once (retried like any transient etcd error).
fn down() -> etcd_client::Error {
    etcd_client::Error::WatchError("the shared watch stream is down".to_owned())
}

/// How many watch streams a locker shares among its lock watches.
pub(crate) const STREAMS: usize = 4;

/// The locker's shared watch streams, each opened on first use.
pub(crate) struct Watches {
    client: Client,
    /// The key of the stream's first watch (see the module docs).
    anchor: String,
    request_timeout: Duration,
    conns: Vec<tokio::sync::Mutex<Option<Conn>>>,
    next_id: AtomicI64,
    next_conn: std::sync::atomic::AtomicUsize,
}

/// What a subscription's messages are routed by.
struct Routes {
    /// False once the stream failed or ended: no message will come any more.
    open: bool,
    by_id: HashMap<i64, mpsc::UnboundedSender<WatchResponse>>,
}

/// Requests to the task that owns the stream's sending half.
enum Request {
    Create(Vec<u8>, WatchOptions),
    Cancel(i64),
}

/// One open stream: the task that reads it (and routes) and the task that writes it.
struct Conn {
    routes: Arc<Mutex<Routes>>,
    requests: mpsc::UnboundedSender<Request>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Conn {
    fn is_open(&self) -> bool {
        lock(&self.routes).open
    }
}

fn lock(routes: &Mutex<Routes>) -> std::sync::MutexGuard<'_, Routes> {
    // A panic while holding the lock leaves the map consistent (inserts and removes
    // only), so a poisoned lock is used as is.
    routes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Watches added together to a shared stream (a lock's watch, see
/// [`crate::lock_watch`]). Dropping it cancels them.
pub(crate) struct Subscription {
    ids: Vec<i64>,
    /// Messages that came while the watches were being set up.
    early: VecDeque<WatchResponse>,
    /// The headers of etcd's confirmations of the watches, in order.
    created: Vec<ResponseHeader>,
    rx: mpsc::UnboundedReceiver<WatchResponse>,
    routes: Arc<Mutex<Routes>>,
    requests: mpsc::UnboundedSender<Request>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut routes = lock(&self.routes);
        for id in &self.ids {
            routes.by_id.remove(id);
        }
        let open = routes.open;
        drop(routes);
        if open {
            for &id in &self.ids {
                let _ = self.requests.send(Request::Cancel(id));
            }
        }
    }
}

impl Subscription {
    /// The next message of this subscription's watches (events, or a watch's
    /// cancellation), in the stream's order; `None` once the stream failed or ended.
    /// The `created` confirmations are not passed on.
    pub(crate) async fn next(&mut self) -> Option<WatchResponse> {
        if let Some(m) = self.early.pop_front() {
            return Some(m);
        }
        self.rx.recv().await
    }

    /// The headers of etcd's confirmations of this subscription's watches. Each header's
    /// revision is etcd's revision when it created that watch, and the watch delivers
    /// every event after it (etcd starts a watch without a start revision at the
    /// revision after its current one): so if the highest of them is `r`, every write to
    /// the watched keys after `r` is delivered. `None` if a confirmation came without a
    /// header.
    pub(crate) fn created(&self) -> Option<&[ResponseHeader]> {
        (self.created.len() == self.ids.len()).then_some(self.created.as_slice())
    }
}

impl Watches {
    pub(crate) fn new(client: Client, anchor: String, request_timeout: Duration) -> Self {
        Watches {
            client,
            anchor,
            request_timeout,
            conns: (0..STREAMS)
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next_id: AtomicI64::new(1),
            next_conn: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Adds a watch for each `(key, options)` to the next shared stream (each from etcd's
    /// current revision, as `options` carry no start revision) and returns once etcd has
    /// confirmed them all: every write to those keys after each confirmation is
    /// delivered. Opens the stream first if there is none; each step has the
    /// request timeout.
    ///
    /// # Errors
    ///
    /// etcd's error if the stream could not be opened; [`etcd_client::Error::WatchError`]
    /// if it failed, or did not confirm the watches within the request timeout (it is
    /// then closed, and the next subscription opens another), or cancelled one.
    pub(crate) async fn subscribe(
        &self,
        watches: Vec<(Vec<u8>, WatchOptions)>,
    ) -> Result<Subscription, etcd_client::Error> {
        // The confirmations must come before the caller's per-request timeout (which
        // runs from about now) ends this call: only then is a stuck stream closed here.
        let until = Instant::now() + self.request_timeout.mul_f64(0.9);
        let (tx, rx) = mpsc::unbounded_channel();
        let (routes, requests, ids) = {
            let i = self.next_conn.fetch_add(1, Ordering::Relaxed) % self.conns.len();
            let mut conn = self.conns[i].lock().await;
            if !conn.as_ref().is_some_and(Conn::is_open) {
                *conn = None;
                *conn = Some(self.open().await?);
            }
            let c = conn.as_ref().ok_or_else(down)?;
            let mut ids = Vec::with_capacity(watches.len());
            {
                let mut routes = lock(&c.routes);
                if !routes.open {
                    // Closed since the check above: nothing would route to us.
                    return Err(down());
                }
                for _ in &watches {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    routes.by_id.insert(id, tx.clone());
                    ids.push(id);
                }
            }
            // Only the routes hold senders now, so a stream that fails (its routes are
            // cleared) ends this subscription's receiver at once.
            drop(tx);
            for ((key, options), &id) in watches.into_iter().zip(&ids) {
                // Sent back to back: etcd confirms them in order, in one round trip.
                if c.requests
                    .send(Request::Create(key, options.with_watch_id(id)))
                    .is_err()
                {
                    return Err(down());
                }
            }
            (c.routes.clone(), c.requests.clone(), ids)
        };
        let mut sub = Subscription {
            ids,
            early: VecDeque::new(),
            created: Vec::new(),
            rx,
            routes,
            requests,
        };
        let mut pending = sub.ids.len();
        while pending > 0 {
            let msg = match tokio::time::timeout_at(until, sub.rx.recv()).await {
                Ok(Some(m)) => m,
                Ok(None) => return Err(down()),
                Err(_) => {
                    // A stream that does not confirm a watch in time is stuck (its
                    // member is cut off, say): every wait on it reads anew, and the
                    // next subscription opens another stream.
                    close(&sub.routes);
                    return Err(down());
                }
            };
            if msg.canceled() {
                return Err(down());
            }
            if msg.created() {
                pending -= 1;
                if let Some(h) = msg.header() {
                    sub.created.push(h.clone());
                }
            } else {
                sub.early.push_back(msg);
            }
        }
        Ok(sub)
    }

    /// Opens the stream, with its first watch on the anchor key.
    async fn open(&self) -> Result<Conn, etcd_client::Error> {
        let mut client = self.client.clone();
        let anchor_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let opened = tokio::time::timeout(
            self.request_timeout,
            client.watch(
                self.anchor.clone(),
                Some(WatchOptions::new().with_watch_id(anchor_id)),
            ),
        )
        .await;
        let (watcher, stream) = match opened {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(down()),
        };
        let routes = Arc::new(Mutex::new(Routes {
            open: true,
            by_id: HashMap::new(),
        }));
        let (requests, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read(stream, routes.clone()));
        let writer = tokio::spawn(write(watcher, rx, routes.clone()));
        Ok(Conn {
            routes,
            requests,
            reader,
            writer,
        })
    }
}

/// Routes each message to the subscription its watch belongs to, until the stream
/// fails or ends; then closes every subscription.
async fn read(mut stream: WatchStream, routes: Arc<Mutex<Routes>>) {
    loop {
        match stream.message().await {
            Ok(Some(msg)) => {
                let mut r = lock(&routes);
                let id = msg.watch_id();
                let last = msg.canceled();
                if let Some(tx) = r.by_id.get(&id) {
                    // A subscription that is gone has its route removed first.
                    let _ = tx.send(msg);
                }
                if last {
                    r.by_id.remove(&id);
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "shared watch stream failed");
                break;
            }
        }
    }
    close(&routes);
}

/// Sends creates and cancels on the stream, in the order they were asked for.
async fn write(
    mut watcher: Watcher,
    mut rx: mpsc::UnboundedReceiver<Request>,
    routes: Arc<Mutex<Routes>>,
) {
    while let Some(req) = rx.recv().await {
        let sent = match req {
            Request::Create(key, options) => watcher.watch(key, Some(options)).await,
            Request::Cancel(id) => watcher.cancel_by_id(id).await,
        };
        if sent.is_err() {
            break;
        }
    }
    close(&routes);
}

fn close(routes: &Mutex<Routes>) {
    let mut r = lock(routes);
    r.open = false;
    // Dropping the senders ends every subscription's receiver.
    r.by_id.clear();
}
