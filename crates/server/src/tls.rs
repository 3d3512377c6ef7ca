//! mTLS: rustls with the `ring` provider, client certificates required.
//!
//! - A client certificate that does not chain to one of the configured roots (another
//!   CA, expired, not for client auth) is refused **in the TLS handshake** (no HTTP
//!   response at all).
//! - A client that presents no certificate completes the handshake and gets **401**
//!   `unauthenticated` on every request, whatever the route (`/metrics` and the OpenAPI
//!   document included): the rule "no certificate -> 401", with a problem body
//!   that says what is missing instead of a bare TLS alert.
//! - A verified certificate whose URI SAN is not a SPIFFE ID (or that has none, or more
//!   than one) gets the same **401** on every request.
//! - Otherwise the caller is the SPIFFE ID of the URI SAN ([`PeerIdentity`]).
//! - `/livez` and `/readyz` answer every connection, with or without a certificate.

use std::future::Future;
use std::sync::Arc;

use axum::{Extension, Router};
use palisade_listen::{Peer, Transport};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpListener;

use super::identity::PeerIdentity;
use super::serve::{app, listen_limits, Stopping};
use super::{health, ServeError, ServiceOptions};
use crate::problem::Problem;
use palisade_api::ProblemKind;
use palisade_api::SpiffeId;
use palisade_lock::Locker;

/// Why a TLS config could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// rustls refused the roots, certificate chain or key.
    #[error("TLS configuration refused")]
    Rustls(#[from] rustls::Error),
    /// The client verifier could not be built (e.g. no roots).
    #[error("client certificate verifier refused")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// A rustls server config that verifies client certificates against `client_roots`
/// (a connection without one is accepted, and [`serve_tls`] answers its requests with
/// 401), and presents `chain` / `key`.
///
/// # Errors
///
/// [`TlsConfigError`].
pub fn server_config(
    client_roots: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for root in client_roots {
        roots.add(root)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The SPIFFE ID in a certificate's URI SAN: exactly one URI SAN, and it is a SPIFFE ID.
pub fn spiffe_id_of(cert: &CertificateDer<'_>) -> Option<SpiffeId> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    let mut uris = san.value.general_names.iter().filter_map(|n| match n {
        GeneralName::URI(u) => Some(*u),
        _ => None,
    });
    let (first, more) = (uris.next()?, uris.next());
    if more.is_some() {
        return None;
    }
    SpiffeId::new(first).ok()
}

/// The whole service as a connection without a usable client certificate sees it: 401
/// `unauthenticated` on every route but the probes of `health`.
fn unauthenticated(locker: Locker) -> Router {
    Router::new()
        .fallback(|| async {
            Problem::new(
                ProblemKind::Unauthenticated,
                "no caller identity: a client certificate with a SPIFFE ID URI SAN is required",
            )
        })
        .merge(health::router(locker))
}

/// Serves the API over mTLS on `listener`, within the options'
/// [`ConnLimits`](palisade_listen::ConnLimits). Each connection's caller is the SPIFFE ID
/// of its client certificate. Runs until the process ends; no client error stops it.
///
/// # Errors
///
/// None today; the `Result` keeps the signature of [`serve_dev`](crate::serve_dev).
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    locker: Locker,
    options: ServiceOptions,
) -> Result<(), ServeError> {
    serve_tls_until(listener, tls, locker, options, std::future::pending()).await
}

/// [`serve_tls`] until `shutdown` completes, then stops gracefully (see `serve_dev_until`):
/// returns once every connection has closed.
///
/// # Errors
///
/// None today; the `Result` keeps the signature of [`serve_dev_until`](crate::serve_dev_until).
pub async fn serve_tls_until(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    locker: Locker,
    options: ServiceOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (stop_handlers, handlers_stopping) = Stopping::new();
    let limits = listen_limits(&options);
    let app = app(locker.clone(), options, handlers_stopping);
    let anonymous = unauthenticated(locker);
    let shutdown = async move {
        shutdown.await;
        stop_handlers.send_replace(true);
    };
    let service = move |peer: &Peer| -> Router {
        let id = peer
            .client_certificates()
            .and_then(|c| c.first())
            .and_then(spiffe_id_of);
        match id {
            Some(id) => app.clone().layer(Extension(PeerIdentity(id))),
            None => anonymous.clone(),
        }
    };
    palisade_listen::serve(listener, Transport::Tls(tls), limits, service, shutdown).await;
    Ok(())
}
