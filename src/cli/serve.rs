//! `palisade serve`: the lock service in front of etcd.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::sync::Arc;

use palisade_lock::{FileEpochStore, Locker, LockerOptions};
use palisade_server::{
    self, Authz, ForceReleaseAudit, ForceReleases, ForcedRelease, ServiceOptions,
};
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
    /// PostgreSQL (libpq key/value or URL form) holding force release requests and the
    /// audit trail's `force_release` records; without it force release is off (404).
    /// Migrations of both are applied at start.
    #[arg(long)]
    database: Option<String>,
    /// INSECURE: plain HTTP, caller identity from the x-palisade-dev-identity header;
    /// loopback only.
    #[arg(long)]
    insecure_dev_identity: bool,
    /// How many sessions one identity may have open at once, across every replica
    /// (each is an etcd lease); past it, opening one answers 429 quota-exceeded.
    #[arg(long, default_value_t = palisade_server::DEFAULT_MAX_SESSIONS_PER_IDENTITY,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions_per_identity: u32,
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
        let mut options = ServiceOptions::new(authz)
            .with_max_sessions_per_identity(args.max_sessions_per_identity);
        if let Some(database) = &args.database {
            options = options.with_force_releases(force_releases(database).await?);
        }
        match (args.tls_cert, args.tls_key, args.client_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
                let key = PrivateKeyDer::from_pem_file(key)?;
                let roots = CertificateDer::pem_file_iter(ca)?.collect::<Result<Vec<_>, _>>()?;
                let tls = palisade_server::server_config(roots, chain, key)?;
                tracing::info!(addr = %args.listen, "serving over mTLS");
                palisade_server::serve_tls(listener, tls, locker, options).await?;
            }
            _ if args.insecure_dev_identity => {
                palisade_server::serve_dev(listener, locker, options.insecure_dev_identity()).await?;
            }
            _ => return Err("either --tls-cert/--tls-key/--client-ca or --insecure-dev-identity".into()),
        }
        Ok(String::new())
    })
}

/// Force release over `database`: the lock service's request table and the audit
/// trail's `force_release` table, both through the audit crate's pool (the lock crate
/// cannot depend on the audit crate, which depends on it, so the binary joins them).
async fn force_releases(database: &str) -> Result<ForceReleases, Box<dyn std::error::Error>> {
    let pool = palisade_audit::pool(database, 4)?;
    palisade_audit::migrate(&pool).await?;
    let force = ForceReleases::new(pool.clone(), Arc::new(AuditTrail(pool)));
    force.migrate().await?;
    Ok(force)
}

/// Writes approved force releases into the audit trail's `force_release` table.
struct AuditTrail(deadpool_postgres::Pool);

impl ForceReleaseAudit for AuditTrail {
    fn record(
        &self,
        r: ForcedRelease,
    ) -> palisade_lock::BoxFuture<'_, Result<(), Box<dyn std::error::Error + Send + Sync>>> {
        Box::pin(async move {
            let client = self.0.get().await?;
            let row = palisade_audit::ForceRelease::new(
                r.request_id,
                palisade_audit::ClusterId(r.cluster_id),
                r.revision,
                r.lock_key,
                r.requester,
                r.approver,
                r.reason,
                r.class_was_fenced,
                r.at,
            )
            .with_grant(r.grant_rev, r.token);
            palisade_audit::insert_force_release(&**client, &row).await?;
            Ok(())
        })
    }
}
