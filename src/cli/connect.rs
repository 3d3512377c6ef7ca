//! The flags that say where the lock service is and who is calling.

use std::path::PathBuf;

use palisade_client::{Client, ClientTls};

use super::exit::{CliError, Result};

/// Where the lock service is and who is calling: mTLS (`--cert`, `--key`, `--ca`) or
/// dev mode (`--dev-identity`). Each flag also reads an environment variable.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Connection {
    /// Lock service URL: `https://host:port` (mTLS) or `http://127.0.0.1:port` (dev mode).
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "PALISADE_SERVICE"
    )]
    service: Option<String>,
    /// mTLS: client certificate chain (PEM, leaf first); its SPIFFE ID URI SAN is the
    /// caller.
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "PALISADE_CERT"
    )]
    cert: Option<PathBuf>,
    /// mTLS: the client certificate's private key (PEM).
    #[arg(long, global = true, help_heading = "Connection", env = "PALISADE_KEY")]
    key: Option<PathBuf>,
    /// mTLS: CA certificates (PEM) the service's certificate must chain to.
    #[arg(long, global = true, help_heading = "Connection", env = "PALISADE_CA")]
    ca: Option<PathBuf>,
    /// Dev mode: the SPIFFE ID to act as, sent in the dev identity header (the service
    /// must run with --insecure-dev-identity; plain HTTP).
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "PALISADE_DEV_IDENTITY"
    )]
    dev_identity: Option<String>,
}

impl Connection {
    /// A client as the flags say.
    ///
    /// # Errors
    ///
    /// Bad input (exit 2) if the service is missing, if neither or both of mTLS and dev
    /// mode are given, if the dev identity is no SPIFFE ID, if mTLS lacks one of its
    /// files, or if a file is unusable.
    pub(crate) fn client(&self) -> Result<Client> {
        let service = self.service.clone().ok_or_else(|| {
            CliError::bad_input("no lock service: pass --service URL (or set PALISADE_SERVICE)")
        })?;
        let tls = self.cert.is_some() || self.key.is_some() || self.ca.is_some();
        match (&self.dev_identity, tls) {
            (Some(_), true) => Err(CliError::bad_input(
                "both mTLS (--cert/--key/--ca) and --dev-identity are given (as flags or PALISADE_* variables): choose one",
            )
            .into()),
            (None, false) => Err(CliError::bad_input(
                "no caller identity: pass --cert, --key and --ca (mTLS; or PALISADE_CERT, \
                 PALISADE_KEY, PALISADE_CA), or --dev-identity for a service in dev mode",
            )
            .into()),
            (Some(id), false) => {
                palisade_api::SpiffeId::new(id).map_err(|e| {
                    CliError::bad_input(format!(
                        "--dev-identity {id:?} (or PALISADE_DEV_IDENTITY) is no SPIFFE ID: {e}"
                    ))
                })?;
                Ok(Client::new(service)?.with_dev_identity(id.clone()))
            }
            (None, true) => {
                let (Some(cert), Some(key), Some(ca)) = (&self.cert, &self.key, &self.ca) else {
                    return Err(
                        CliError::bad_input("mTLS needs all of --cert, --key and --ca").into(),
                    );
                };
                let tls = ClientTls::from_ca_file(ca)?.with_identity_files(cert, key)?;
                Ok(Client::new_mtls(service, tls)?)
            }
        }
    }
}

/// Runs `f` on a one-thread runtime.
pub(crate) fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}
