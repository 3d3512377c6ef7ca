//! [`LossyProxy`]: a TCP proxy on loopback that loses a request or its answer on demand,
//! for tests of what a client does when an answer never comes back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

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
}

impl Loss {
    fn from_u8(v: u8) -> Loss {
        match v {
            1 => Loss::NextRequest,
            2 => Loss::NextAnswer,
            3 => Loss::Everything,
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

    /// What the proxy does now ([`Loss::NextRequest`] and [`Loss::NextAnswer`] turn back
    /// into [`Loss::None`] once they happened).
    pub fn loss(&self) -> Loss {
        Loss::from_u8(self.loss.load(Ordering::SeqCst))
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Pumps both ways until either side closes or a loss closes both.
async fn carry(client: TcpStream, server: TcpStream, loss: Arc<AtomicU8>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let up_loss = loss.clone();
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let now = up_loss.load(Ordering::SeqCst);
            if now == Loss::Everything as u8
                || up_loss
                    .compare_exchange(
                        Loss::NextRequest as u8,
                        Loss::None as u8,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    )
                    .is_ok()
            {
                return;
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if loss
                .compare_exchange(
                    Loss::NextAnswer as u8,
                    Loss::None as u8,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever pump stops first ends the connection: both halves are dropped.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
