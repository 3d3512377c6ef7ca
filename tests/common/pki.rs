//! A CA and SVIDs made with rcgen, as PEM (in memory and in files).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair, SanType};

/// A certificate authority.
pub struct Pki {
    ca: Certificate,
    ca_key: KeyPair,
}

/// A leaf certificate and its key, PEM.
pub struct Svid {
    pub cert_pem: String,
    pub key_pem: String,
}

/// PEM files of one SVID in a directory.
pub struct SvidFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let ca = params.self_signed(&ca_key).unwrap();
        Pki { ca, ca_key }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// Writes the CA certificate to `dir/ca.pem`.
    pub fn ca_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.ca_pem()).unwrap();
        path
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self) -> Svid {
        self.leaf(&["localhost", "127.0.0.1"], &[])
    }

    /// A client certificate with the given URI SANs (a SPIFFE ID for an SVID).
    pub fn client(&self, uris: &[&str]) -> Svid {
        self.leaf(&[], uris)
    }

    fn leaf(&self, names: &[&str], uris: &[&str]) -> Svid {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "palisade test");
        for u in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*u).try_into().unwrap()));
        }
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        Svid {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl Svid {
    /// Writes `dir/<name>.pem` and `dir/<name>.key`.
    pub fn files(&self, dir: &Path, name: &str) -> SvidFiles {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        SvidFiles { cert, key }
    }
}
