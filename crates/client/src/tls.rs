//! [`ClientTls`]: the CA bundle and the client certificate (SVID) of an mTLS client.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{ClientError, ClientErrorKind};

/// The mTLS settings of a [`Client`](super::Client): the CA certificates the service's
/// certificate must chain to, and the client's own certificate chain and private key
/// (an X.509 SVID: the service takes the caller's identity from its SPIFFE URI SAN).
///
/// rustls with the `ring` provider, TLS 1.2 and 1.3, HTTP/1.1 (no ALPN offered). The
/// service's certificate is checked against the host of the service URL (DNS name or IP
/// address SAN), as for any HTTPS server.
///
/// Without a client certificate ([`ClientTls::with_identity`] not called) the service
/// answers every request with 401; requests then fail with
/// [`ProblemKind::Unauthenticated`](crate::ProblemKind::Unauthenticated).
///
/// ```no_run
/// # fn demo() -> Result<(), palisade_client::ClientError> {
/// use palisade_client::{Client, ClientTls};
///
/// let tls = ClientTls::from_ca_file("/etc/palisade/ca.pem")?
///     .with_identity_files("/run/svid/cert.pem", "/run/svid/key.pem")?;
/// let client = Client::new_mtls("https://locks.internal:8443", tls)?;
/// # let _ = client; Ok(()) }
/// ```
pub struct ClientTls {
    roots: Vec<CertificateDer<'static>>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl Clone for ClientTls {
    fn clone(&self) -> Self {
        ClientTls {
            roots: self.roots.clone(),
            identity: self
                .identity
                .as_ref()
                .map(|(chain, key)| (chain.clone(), key.clone_key())),
        }
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("roots", &self.roots.len())
            .field(
                "identity_chain",
                &self.identity.as_ref().map(|(c, _)| c.len()),
            )
            .finish_non_exhaustive()
    }
}

fn config_error(detail: String, source: Option<rustls::pki_types::pem::Error>) -> ClientError {
    ClientError {
        kind: ClientErrorKind::Config,
        status: None,
        detail,
        source: source.map(|e| Box::new(e) as _),
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|e| ClientError {
        kind: ClientErrorKind::Config,
        status: None,
        detail: format!("cannot read the {what} {}: {e}", path.display()),
        source: Some(Box::new(e)),
    })
}

impl ClientTls {
    /// Trusts the CA certificates `roots` (DER) for the service's certificate; no client
    /// certificate yet.
    pub fn new(roots: Vec<CertificateDer<'static>>) -> Self {
        ClientTls {
            roots,
            identity: None,
        }
    }

    /// Trusts the CA certificates of a PEM bundle (one or more `CERTIFICATE` blocks).
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::Config`] if the bundle holds no certificate or a malformed one.
    pub fn from_ca_pem(pem: &[u8]) -> Result<Self, ClientError> {
        let roots = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| config_error(format!("malformed CA bundle: {e}"), Some(e)))?;
        if roots.is_empty() {
            return Err(config_error(
                "the CA bundle holds no CERTIFICATE block".into(),
                None,
            ));
        }
        Ok(ClientTls::new(roots))
    }

    /// [`ClientTls::from_ca_pem`] of the file at `path`.
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::Config`] if the file cannot be read or holds no certificate.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let path = path.as_ref();
        ClientTls::from_ca_pem(&read(path, "CA bundle")?).map_err(|e| e.in_file(path.display()))
    }

    /// Presents `chain` (leaf first, DER) and its private `key` as the client
    /// certificate.
    #[must_use]
    pub fn with_identity(
        mut self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Self {
        self.identity = Some((chain, key));
        self
    }

    /// [`ClientTls::with_identity`] from PEM: `cert_pem` holds the chain (leaf first),
    /// `key_pem` one private key (PKCS#8, PKCS#1 or SEC1).
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::Config`] if either holds nothing usable.
    pub fn with_identity_pem(self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, ClientError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| config_error(format!("malformed client certificate: {e}"), Some(e)))?;
        if chain.is_empty() {
            return Err(config_error(
                "the client certificate file holds no CERTIFICATE block".into(),
                None,
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| config_error(format!("no usable private key: {e}"), Some(e)))?;
        Ok(self.with_identity(chain, key))
    }

    /// [`ClientTls::with_identity_pem`] of the files at `cert` and `key`.
    ///
    /// # Errors
    ///
    /// [`ClientErrorKind::Config`] if a file cannot be read or holds nothing usable.
    pub fn with_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, ClientError> {
        let (cert, key) = (cert.as_ref(), key.as_ref());
        let cert_pem = read(cert, "client certificate")?;
        let key_pem = read(key, "client key")?;
        self.with_identity_pem(&cert_pem, &key_pem)
            .map_err(|e| e.in_file(format!("{} / {}", cert.display(), key.display())))
    }

    /// The rustls config (ring provider).
    pub(crate) fn config(&self) -> Result<ClientConfig, ClientError> {
        let rustls_err = |e: rustls::Error| ClientError {
            kind: ClientErrorKind::Config,
            status: None,
            detail: format!("TLS configuration refused: {e}"),
            source: Some(Box::new(e)),
        };
        let mut roots = RootCertStore::empty();
        for root in &self.roots {
            roots.add(root.clone()).map_err(rustls_err)?;
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(rustls_err)?
                .with_root_certificates(roots);
        match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(rustls_err),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}
