//! [`LossyProxy`]: a TCP proxy on loopback that loses a request or its answer on demand,
//! or cuts a client off while the server still works on its request, for tests of what
//! a client does when an answer never comes back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does with the traffic it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Loss {
    /// Passes everything on.
    None = 0,
    /// The next bytes a client sends are dropped and that connection is closed: the
    /// request never reaches the server. Then back to [`Loss::None`].
    NextRequest = 1,
    /// The next bytes the server answers are dropped and that connection is closed after
    /// the request reached the server: the server acted, the client never hears of it.
    /// Then back to [`Loss::None`].
    NextAnswer = 2,
    /// Every request is dropped (its connection closed) until told otherwise.
    Everything = 3,
    /// The next bytes a client sends reach the server, and then the client's side of
    /// that connection is reset at once, while the server's side stays open: the server
    /// goes on with the request and never learns that the client is gone (its answer is
    /// read and dropped), as when a middlebox between them lost the flow. The client sees
    /// its connection reset before any answer, typically while a long-poll still waits.
    /// Then back to [`Loss::None`].
    ResetClient = 4,
}

impl Loss {
    fn from_u8(v: u8) -> Loss {
        match v {
            1 => Loss::NextRequest,
            2 => Loss::NextAnswer,
            3 => Loss::Everything,
            4 => Loss::ResetClient,
            _ => Loss::None,
        }
    }
}

/// A TCP proxy from a free loopback port to `upstream`, one pair of pumps per
/// connection. Stops accepting when dropped.
#[derive(Debug)]
pub struct LossyProxy {
    addr: SocketAddr,
    loss: Arc<AtomicU8>,
    /// Closes every connection open when it is sent ([`LossyProxy::reset_open`]).
    reset: tokio::sync::watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl LossyProxy {
    /// Starts a proxy to `upstream`.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound (a test harness failure).
    pub async fn start(upstream: SocketAddr) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let loss = Arc::new(AtomicU8::new(Loss::None as u8));
        let shared = loss.clone();
        let (reset, resets) = tokio::sync::watch::channel(0u64);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let loss = shared.clone();
                let mut resets = resets.clone();
                resets.mark_unchanged();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        tokio::select! {
                            () = carry(client, server, loss) => {}
                            _ = resets.changed() => {}
                        }
                    }
                });
            }
        });
        LossyProxy {
            addr,
            loss,
            reset,
            accept,
        }
    }

    /// Closes every connection open now, both ways, whatever it carries (a request
    /// waiting for its answer: the client sees its connection reset, the server its
    /// client gone). Connections opened later are carried as usual.
    pub fn reset_open(&self) {
        self.reset.send_modify(|n| *n += 1);
    }

    /// The proxy's address: point the client here.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets what happens to the traffic from now on.
    pub fn set(&self, loss: Loss) {
        self.loss.store(loss as u8, Ordering::SeqCst);
    }

    /// What the proxy does now ([`Loss::NextRequest`], [`Loss::NextAnswer`] and
    /// [`Loss::ResetClient`] turn back into [`Loss::None`] once they happened).
    pub fn loss(&self) -> Loss {
        Loss::from_u8(self.loss.load(Ordering::SeqCst))
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// How long a server whose client was reset ([`Loss::ResetClient`]) may take to answer
/// before the proxy closes its side too.
const RESET_SERVER_GRACE: Duration = Duration::from_secs(60);

/// How a connection's pumps ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Either side closed, or a loss closed both.
    Closed,
    /// [`Loss::ResetClient`]: the request went to the server; the client is to be cut off.
    ResetClient,
}

/// Takes `from` (the loss armed now) back to [`Loss::None`]; whether it was armed.
fn fire(loss: &AtomicU8, from: Loss) -> bool {
    loss.compare_exchange(
        from as u8,
        Loss::None as u8,
        Ordering::SeqCst,
        Ordering::SeqCst,
    )
    .is_ok()
}

/// Pumps both ways until either side closes or a loss closes both. After a
/// [`Loss::ResetClient`], resets the client's side and keeps the server's open, reading
/// and dropping what it sends, until it closes or [`RESET_SERVER_GRACE`] passes.
async fn carry(client: TcpStream, server: TcpStream, loss: Arc<AtomicU8>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let ended = {
        let up = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return Ended::Closed,
                    Ok(n) => n,
                };
                if loss.load(Ordering::SeqCst) == Loss::Everything as u8
                    || fire(&loss, Loss::NextRequest)
                {
                    return Ended::Closed;
                }
                let reset = fire(&loss, Loss::ResetClient);
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return Ended::Closed;
                }
                if reset {
                    return Ended::ResetClient;
                }
            }
        };
        let down = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match server_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if fire(&loss, Loss::NextAnswer) {
                    return;
                }
                if client_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        // Whichever pump stops first ends the connection.
        tokio::select! {
            ended = up => ended,
            () = down => Ended::Closed,
        }
    };
    if ended == Ended::ResetClient {
        // A zero linger makes the close a reset (RST), not an orderly end of stream.
        if let Ok(client) = client_rx.reunite(client_tx) {
            let _ = client.set_zero_linger();
        }
        let drain = async {
            let mut buf = vec![0u8; 16 * 1024];
            while matches!(server_rx.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        let _ = tokio::time::timeout(RESET_SERVER_GRACE, drain).await;
        drop(server_tx);
    }
}
