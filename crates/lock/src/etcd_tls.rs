//! [`EtcdTls`]: how a client of one etcd cluster (a tier) checks the members and shows
//! itself to them.
//!
//! etcd serves TLS on `https://` client URLs when started with `--cert-file` and
//! `--key-file`; with `--client-cert-auth` and `--trusted-ca-file` it also wants a client
//! certificate chained to that CA. A client of such a cluster needs the CA that the
//! members' certificates chain to, and, for client-cert-auth, its own certificate and
//! key. Every etcd client of this workspace takes one `EtcdTls` per cluster: the locker
//! directly, the audit tailer and the dashboard's live view as its
//! [`EtcdTls::tls_options`].
//!
//! The PEM is checked when the value is made, so a wrong file is refused at start with
//! what is wrong with it, not at the first connection as a handshake error.

use std::path::Path;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// TLS to one etcd cluster: the CA certificates its members' certificates must chain to,
/// and optionally the client certificate and key that etcd's `--client-cert-auth` asks
/// for. Endpoints used with it must be `https://`. Cheap to clone (the PEM is shared).
#[derive(Clone)]
pub struct EtcdTls {
    ca_pem: std::sync::Arc<[u8]>,
    identity: Option<std::sync::Arc<(Vec<u8>, Vec<u8>)>>,
    domain: Option<String>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_identity", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// One of the files of an [`EtcdTls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPart {
    /// The CA certificates the members' certificates chain to.
    Ca,
    /// The client certificate chain.
    ClientCert,
    /// The client certificate's private key.
    ClientKey,
}

impl std::fmt::Display for TlsPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsPart::Ca => "CA file",
            TlsPart::ClientCert => "client certificate",
            TlsPart::ClientKey => "client key",
        })
    }
}

/// Why TLS material for etcd was refused: which part, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdTlsError {
    /// A file could not be read.
    #[error("cannot read the etcd {part} {path}: {source}")]
    Read {
        /// Which file.
        part: TlsPart,
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The PEM holds no certificate (or no private key, for the key) or does not parse.
    #[error("the etcd {part} {origin} holds no {wanted} in PEM form{detail}")]
    BadPem {
        /// Which file.
        part: TlsPart,
        /// The file, or `(given in memory)`.
        origin: String,
        /// What it should hold: `certificate` or `private key`.
        wanted: &'static str,
        /// The parser's complaint, if any, starting with `: `.
        detail: String,
    },
    /// The key is encrypted (`ENCRYPTED PRIVATE KEY`), which is not supported.
    #[error(
        "the etcd client key {origin} is encrypted, which is not supported: decrypt it \
         (`openssl pkey -in KEY -out PLAIN`) and keep the plain file readable only by the service"
    )]
    EncryptedKey {
        /// The file, or `(given in memory)`.
        origin: String,
    },
    /// The key is not the client certificate's, or of a kind that cannot sign.
    #[error("the etcd client key {origin} does not fit the client certificate: {reason}")]
    KeyMismatch {
        /// The key file, or `(given in memory)`.
        origin: String,
        /// What TLS said.
        reason: String,
    },
}

impl EtcdTlsError {
    /// The file the error is about.
    pub fn part(&self) -> TlsPart {
        match self {
            EtcdTlsError::Read { part, .. } | EtcdTlsError::BadPem { part, .. } => *part,
            EtcdTlsError::EncryptedKey { .. } | EtcdTlsError::KeyMismatch { .. } => {
                TlsPart::ClientKey
            }
        }
    }
}

const IN_MEMORY: &str = "(given in memory)";

impl EtcdTls {
    /// Trusts the CA certificates in `ca_pem` (one or more PEM `CERTIFICATE` blocks) for
    /// the members' certificates; no client certificate.
    ///
    /// # Errors
    ///
    /// [`EtcdTlsError::BadPem`] if `ca_pem` holds no certificate.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Result<EtcdTls, EtcdTlsError> {
        let ca_pem = ca_pem.into();
        check_certs(TlsPart::Ca, IN_MEMORY, &ca_pem)?;
        Ok(EtcdTls {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        })
    }

    /// Shows the client certificate chain `cert_pem` with its private key `key_pem` (PEM)
    /// to the members, as etcd's `--client-cert-auth` requires.
    ///
    /// # Errors
    ///
    /// [`EtcdTlsError::BadPem`] if `cert_pem` holds no certificate or `key_pem` no
    /// private key.
    pub fn with_identity(
        self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Result<EtcdTls, EtcdTlsError> {
        let (cert, key) = (cert_pem.into(), key_pem.into());
        check_certs(TlsPart::ClientCert, IN_MEMORY, &cert)?;
        check_key(IN_MEMORY, &cert, &key)?;
        Ok(self.identity_unchecked(cert, key))
    }

    /// Reads `ca` and, if given, the client certificate `cert` and key `key` from PEM
    /// files, as [`EtcdTls::new`] and [`EtcdTls::with_identity`].
    ///
    /// # Errors
    ///
    /// [`EtcdTlsError::Read`] naming the file that cannot be read;
    /// [`EtcdTlsError::BadPem`] naming the file that holds no certificate or key.
    pub fn from_files(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<EtcdTls, EtcdTlsError> {
        let ca_pem = read(TlsPart::Ca, ca)?;
        check_certs(TlsPart::Ca, &ca.display().to_string(), &ca_pem)?;
        let tls = EtcdTls {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        };
        let Some((cert, key)) = identity else {
            return Ok(tls);
        };
        let cert_pem = read(TlsPart::ClientCert, cert)?;
        check_certs(TlsPart::ClientCert, &cert.display().to_string(), &cert_pem)?;
        let key_pem = read(TlsPart::ClientKey, key)?;
        check_key(&key.display().to_string(), &cert_pem, &key_pem)?;
        Ok(tls.identity_unchecked(cert_pem, key_pem))
    }

    /// Checks the members' certificates against `name` instead of the host of each
    /// endpoint (for endpoints given by address when the certificates name a host).
    #[must_use]
    pub fn with_domain(mut self, name: impl Into<String>) -> EtcdTls {
        self.domain = Some(name.into());
        self
    }

    /// Whether a client certificate is shown.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// `options` with this TLS configuration, for `etcd_client::Client::connect`.
    pub fn apply(&self, options: ConnectOptions) -> ConnectOptions {
        options.with_tls(self.tls_options())
    }

    /// This configuration as etcd-client's TLS options (for crates that connect to etcd
    /// without this one, as the audit tailer).
    pub fn tls_options(&self) -> TlsOptions {
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&*self.ca_pem));
        if let Some(identity) = &self.identity {
            tls = tls.identity(Identity::from_pem(&identity.0, &identity.1));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        tls
    }

    fn identity_unchecked(mut self, cert: Vec<u8>, key: Vec<u8>) -> EtcdTls {
        self.identity = Some(std::sync::Arc::new((cert, key)));
        self
    }
}

/// `options` with `tls` applied, if any.
pub(crate) fn apply(tls: Option<&EtcdTls>, options: ConnectOptions) -> ConnectOptions {
    match tls {
        Some(tls) => tls.apply(options),
        None => options,
    }
}

fn read(part: TlsPart, path: &Path) -> Result<Vec<u8>, EtcdTlsError> {
    std::fs::read(path).map_err(|source| EtcdTlsError::Read {
        part,
        path: path.display().to_string(),
        source,
    })
}

fn check_certs(part: TlsPart, origin: &str, pem: &[u8]) -> Result<(), EtcdTlsError> {
    let bad = |detail: String| EtcdTlsError::BadPem {
        part,
        origin: origin.to_owned(),
        wanted: "certificate",
        detail,
    };
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| bad(format!(": {e}")))?;
        found += 1;
    }
    if found == 0 {
        return Err(bad(String::new()));
    }
    Ok(())
}

/// The key parses, is not encrypted, and is the first certificate's of `cert_pem`.
fn check_key(origin: &str, cert_pem: &[u8], pem: &[u8]) -> Result<(), EtcdTlsError> {
    if pem
        .windows(b"ENCRYPTED PRIVATE KEY".len())
        .any(|w| w == b"ENCRYPTED PRIVATE KEY")
    {
        return Err(EtcdTlsError::EncryptedKey {
            origin: origin.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| EtcdTlsError::BadPem {
        part: TlsPart::ClientKey,
        origin: origin.to_owned(),
        wanted: "private key",
        detail: format!(": {e}"),
    })?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(std::result::Result::ok)
        .collect();
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key, &provider)
        .map(drop)
        .map_err(|e| EtcdTlsError::KeyMismatch {
            origin: origin.to_owned(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_PEM: &[u8] = b"this is not a certificate\n";

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, NOT_PEM).unwrap();
        let e = EtcdTls::from_files(&ca, None).unwrap_err();
        let text = e.to_string();
        assert!(matches!(
            e,
            EtcdTlsError::BadPem {
                part: TlsPart::Ca,
                ..
            }
        ));
        assert!(text.contains(&ca.display().to_string()), "{text}");
        assert!(text.contains("holds no certificate"), "{text}");
    }

    #[test]
    fn a_missing_key_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        let missing = dir.path().join("client.key");
        let e = EtcdTls::from_files(&ca, Some((&ca, &missing))).unwrap_err();
        assert!(
            matches!(
                e,
                EtcdTlsError::Read {
                    part: TlsPart::ClientKey,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("client.key"), "{e}");
    }

    #[test]
    fn a_certificate_given_as_the_key_is_refused() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let pem = cert.cert.pem();
        let e = EtcdTls::new(pem.clone())
            .unwrap()
            .with_identity(pem.clone(), pem)
            .unwrap_err();
        assert!(
            matches!(
                e,
                EtcdTlsError::BadPem {
                    part: TlsPart::ClientKey,
                    wanted: "private key",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn another_certificates_key_or_an_encrypted_key_is_refused() {
        let ours = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let theirs = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let ca = EtcdTls::new(ours.cert.pem()).unwrap();
        let e = ca
            .clone()
            .with_identity(ours.cert.pem(), theirs.key_pair.serialize_pem())
            .unwrap_err();
        assert!(matches!(e, EtcdTlsError::KeyMismatch { .. }), "{e}");
        assert_eq!(e.part(), TlsPart::ClientKey);
        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let e = ca.with_identity(ours.cert.pem(), encrypted).unwrap_err();
        assert!(matches!(e, EtcdTlsError::EncryptedKey { .. }), "{e}");
        assert!(e.to_string().contains("openssl pkey"), "{e}");
    }

    #[test]
    fn good_pem_makes_a_configuration_with_an_identity() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let tls = EtcdTls::new(cert.cert.pem())
            .unwrap()
            .with_identity(cert.cert.pem(), cert.key_pair.serialize_pem())
            .unwrap();
        assert!(tls.has_identity());
        assert!(!EtcdTls::new(cert.cert.pem()).unwrap().has_identity());
    }
}
