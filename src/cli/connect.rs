//! The flags that say where the lock service is and who is calling.

use std::path::PathBuf;
use std::time::Duration;

use palisade_client::{Client, ClientTls};

use super::exit::{CliError, Exit, Result};

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
    /// The longest a command waits for the service, in milliseconds: past it the command
    /// stops waiting and exits (1, or 74 for a release or an acquire whose outcome is
    /// unknown). An acquire's `--wait-ms` adds to it; `lock run`'s command runs as long
    /// as it needs.
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "PALISADE_TIMEOUT_MS",
        default_value_t = DEFAULT_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..),
    )]
    timeout_ms: u64,
}

/// The default of `--timeout-ms`: 30 s, room for a release's 10 s of retries and the
/// session close after it.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

impl Connection {
    /// `--timeout-ms`: how long a command waits for the service (beyond an acquire's wait).
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The service's URL as given (empty if none was).
    pub(crate) fn service(&self) -> &str {
        self.service.as_deref().unwrap_or_default()
    }

    /// The failure (exit 1) of a command whose service did not answer `what` in time.
    pub(crate) fn no_answer(&self, what: &str) -> CliError {
        CliError::new(
            Exit::Failure,
            format!(
                "{what}: no answer from the lock service at {} within --timeout-ms ({} ms)",
                self.service(),
                self.timeout_ms
            ),
        )
    }

    /// Runs `f`, one exchange with the service, on a one-thread runtime; if it has not
    /// finished within `--timeout-ms`, it is dropped (its requests with it) and the
    /// command fails with exit 1.
    pub(crate) fn block_on<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let timeout = self.timeout();
        block_on(async move {
            match tokio::time::timeout(timeout, f).await {
                Ok(done) => done,
                Err(_) => Err(self.no_answer(what).into()),
            }
        })
    }

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

/// Runs `f` on a one-thread runtime, with no bound of its own: for commands that bound
/// each of their waits themselves (`lock acquire`, `lock release`, `lock run`).
pub(crate) fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}
