//! One accepted connection: the TLS handshake under its bound, then HTTP/1.1 (and HTTP/2
//! when the limits say so) under the head bound, until the client closes, a bound passes, the table evicts it or the
//! listener stops.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::io::WriteStall;
use crate::service::{BoxError, ConnService};
use crate::table::Slot;
use crate::ConnLimits;

/// Who is on the other end of a connection, as the listener's service factory sees it.
#[derive(Debug, Clone)]
pub struct Peer {
    addr: SocketAddr,
    certificates: Option<Vec<CertificateDer<'static>>>,
}

impl Peer {
    /// The client's socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The certificate chain the client presented in the TLS handshake, its own first;
    /// `None` over plain HTTP or when it presented none. Verified against the server
    /// config's client verifier by the time the factory sees it.
    pub fn client_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.certificates.as_deref()
    }
}

/// The stream under HTTP: plain TCP or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What every connection of one listener shares.
pub(crate) struct Shared<M> {
    pub(crate) limits: ConnLimits,
    pub(crate) tls: Option<TlsAcceptor>,
    pub(crate) make: M,
    pub(crate) probe_paths: Arc<[String]>,
}

/// Serves one connection to its end. `probes_only`: it is on the probe reserve.
pub(crate) async fn serve_connection<M, S, B>(
    tcp: TcpStream,
    addr: SocketAddr,
    shared: Arc<Shared<M>>,
    slot: Slot,
    probes_only: bool,
    mut stop: watch::Receiver<bool>,
) where
    M: Fn(&Peer) -> S,
    S: tower::Service<http::Request<axum::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<crate::service::BoxError>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::service::BoxError>,
{
    let limits = &shared.limits;
    let (io, peer): (Box<dyn Io>, Peer) = match &shared.tls {
        None => (
            Box::new(tcp),
            Peer {
                addr,
                certificates: None,
            },
        ),
        Some(acceptor) => {
            let handshake = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp));
            let stream = tokio::select! {
                done = handshake => match done {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::info!(peer = %addr, error = %e, "TLS handshake refused");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(peer = %addr, "TLS handshake not finished within {:?}; closed", limits.handshake_timeout);
                        return;
                    }
                },
                () = slot.evicted() => return,
                () = stopped(&mut stop) => return,
            };
            let certificates = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec);
            (Box::new(stream), Peer { addr, certificates })
        }
    };
    let service = ConnService {
        inner: (shared.make)(&peer),
        peer: addr,
        busy: slot.busy(),
        body_stall: limits.body_stall_timeout,
        probes_only: probes_only.then(|| Arc::clone(&shared.probe_paths)),
    };
    let io = TokioIo::new(WriteStall::new(io, limits.body_stall_timeout));
    let service = TowerToHyperService::new(service);
    // Upgrades (a 101 answer, e.g. WebSocket) are the service's to take: a service that
    // never answers 101 never sees one.
    let result = if limits.http2 {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .keep_alive(!probes_only);
        builder.http2().timer(TokioTimer::new());
        let conn = builder.serve_connection_with_upgrades(io, service);
        drive(conn, |c| c.graceful_shutdown(), &slot, &mut stop, addr).await
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .keep_alive(!probes_only);
        let conn = builder.serve_connection(io, service).with_upgrades();
        drive(conn, |c| c.graceful_shutdown(), &slot, &mut stop, addr)
            .await
            .map_err(BoxError::from)
    };
    if let Err(e) = result {
        tracing::debug!(peer = %addr, error = %e, "connection ended with an error");
    }
}

/// Runs `conn` until it ends; when the table evicts it or the listener stops, shuts it
/// down gracefully (what is in flight is answered, an idle connection closes at once).
async fn drive<C, E>(
    conn: C,
    shutdown: impl FnOnce(std::pin::Pin<&mut C>),
    slot: &Slot,
    stop: &mut watch::Receiver<bool>,
    addr: SocketAddr,
) -> Result<(), E>
where
    C: std::future::Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => r,
        () = async {
            tokio::select! {
                () = slot.evicted() => tracing::debug!(peer = %addr, "idle connection closed to make room"),
                () = stopped(stop) => {}
            }
        } => {
            shutdown(conn.as_mut());
            conn.await
        }
    }
}

/// Completes once `stop` says so (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
