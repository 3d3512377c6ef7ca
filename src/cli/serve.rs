//! `palisade serve`: the lock service in front of etcd.

use std::net::SocketAddr;
use std::path::PathBuf;

use palisade_lock::service::{self, Authz, ServiceOptions};
use palisade_lock::{FileEpochStore, Locker, LockerOptions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Flags of `palisade serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// etcd client endpoints (`http://host:port`), comma-separated or repeated.
    #[arg(long, required = true, value_delimiter = ',')]
    etcd: Vec<String>,
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// Authorization config (TOML); reloaded on SIGHUP.
    #[arg(long)]
    config: PathBuf,
    /// The durable epoch record (a JSON file on a volume every replica shares).
    #[arg(long)]
    epoch_file: PathBuf,
    /// Root prefix of the key space in etcd.
    #[arg(long, default_value = palisade_lock::DEFAULT_ROOT)]
    root: String,
    /// Server certificate chain (PEM), for mTLS.
    #[arg(long, requires_all = ["tls_key", "client_ca"], conflicts_with = "insecure_dev_identity")]
    tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to.
    #[arg(long)]
    client_ca: Option<PathBuf>,
    /// INSECURE: plain HTTP, caller identity from the x-palisade-dev-identity header;
    /// loopback only.
    #[arg(long)]
    insecure_dev_identity: bool,
}

pub(crate) fn run(args: ServeArgs) -> Result<String, Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let authz = Authz::load(&args.config)?;
        let reload = authz.clone();
        tokio::spawn(async move {
            let Ok(mut hup) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            else {
                return;
            };
            while hup.recv().await.is_some() {
                if let Err(e) = reload.reload() {
                    tracing::error!(error = %e, "authorization config not reloaded; the old one stays");
                }
            }
        });
        let locker = Locker::connect(
            LockerOptions::new(args.etcd).with_root(args.root),
            FileEpochStore::new(args.epoch_file),
        )
        .await?;
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        let options = ServiceOptions::new(authz);
        match (args.tls_cert, args.tls_key, args.client_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
                let key = PrivateKeyDer::from_pem_file(key)?;
                let roots = CertificateDer::pem_file_iter(ca)?.collect::<Result<Vec<_>, _>>()?;
                let tls = service::server_config(roots, chain, key)?;
                tracing::info!(addr = %args.listen, "serving over mTLS");
                service::serve_tls(listener, tls, locker, options).await?;
            }
            _ if args.insecure_dev_identity => {
                service::serve_dev(listener, locker, options.insecure_dev_identity()).await?;
            }
            _ => return Err("either --tls-cert/--tls-key/--client-ca or --insecure-dev-identity".into()),
        }
        Ok(String::new())
    })
}
