//! TLS material for an etcd cluster of the kit: a CA made for the cluster, a server
//! certificate every member serves, and a client certificate etcd's
//! `--client-cert-auth` accepts, all written as PEM files into a temp dir.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use tempfile::TempDir;

/// The PEM files of one TLS cluster: its CA, the members' certificate (for `localhost`
/// and each member's address) and a client certificate. Removed when the cluster is
/// dropped.
#[derive(Debug)]
pub struct EtcdTlsFiles {
    dir: TempDir,
}

impl EtcdTlsFiles {
    /// A fresh CA, and a server certificate for `localhost` and `addrs` and a client
    /// certificate (CN `palisade-test-client`) signed by it.
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or a file cannot be written.
    pub(crate) fn new(addrs: &[IpAddr]) -> EtcdTlsFiles {
        let dir = tempfile::Builder::new()
            .prefix("palisade-etcd-tls-")
            .tempdir_in(super::member::temp_root())
            .unwrap_or_else(|e| panic!("creating a temp dir for etcd TLS files: {e}"));
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.distinguished_name
            .push(DnType::CommonName, "palisade test etcd CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");

        let server_key = KeyPair::generate().expect("a server key");
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned()]).expect("server parameters");
        server.subject_alt_names.extend(
            addrs
                .iter()
                .chain(&[IpAddr::from([127, 0, 0, 1])])
                .map(|a| SanType::IpAddress(*a)),
        );
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            // etcd also dials its own client URL (the gateway) with this certificate.
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_cert = server
            .signed_by(&server_key, &ca_cert, &ca_key)
            .expect("the server certificate");

        let client_key = KeyPair::generate().expect("a client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        client
            .distinguished_name
            .push(DnType::CommonName, "palisade-test-client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client
            .signed_by(&client_key, &ca_cert, &ca_key)
            .expect("the client certificate");

        let files = EtcdTlsFiles { dir };
        let write = |name: &str, pem: String| {
            let path = files.dir.path().join(name);
            std::fs::write(&path, pem)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        };
        write("ca.pem", ca_cert.pem());
        write("server.pem", server_cert.pem());
        write("server.key", server_key.serialize_pem());
        write("client.pem", client_cert.pem());
        write("client.key", client_key.serialize_pem());
        files
    }

    /// The CA certificate the members' and the client's certificates chain to.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The client certificate (CN `palisade-test-client`).
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client certificate's private key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The contents of `path` (one of the files above).
    ///
    /// # Panics
    ///
    /// If it cannot be read.
    pub fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    pub(crate) fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    pub(crate) fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}
