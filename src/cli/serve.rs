//! `palisade serve`: the lock service in front of etcd, run as a daemon.
//!
//! - Prints `listening on URL` on stdout once it accepts connections.
//! - Stops gracefully on SIGTERM or SIGINT: no new connection, in-flight requests answered
//!   within `--shutdown-grace-ms`, then exit 0.
//! - Holds connections within bounds (`--max-connections`, `--header-timeout-ms`, ...;
//!   see `palisade_listen`): an idle or slow client is closed, running out of file
//!   descriptors is logged with the limit and retried, never the end of the process.
//! - Logs to stderr: text (colours only on a terminal) or JSON lines (`--log-format json`),
//!   filtered by `RUST_LOG` (default `info`).
//! - Every startup error names the file, address or endpoint and the cause. A locker whose
//!   epoch records disagree (e.g. the epoch file is missing while etcd has an epoch) starts
//!   not ready: `/readyz` answers 503, every acquire 503 `epoch-mismatch`, and an error is
//!   logged at start with what to do.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use palisade_lock::{FileEpochStore, Locker, LockerOptions};
use palisade_server::{
    self, Authz, ForceReleaseAudit, ForceReleases, ForcedRelease, ServiceOptions,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::signal::unix::{signal, SignalKind};

use super::etcd::{self, EtcdTarget, EtcdTlsArgs, TierTlsArgs};
use super::exit::{with_causes, CliError, Exit, Result};
use super::listen::ListenArgs;

/// The authorization config's format, as `serve --help` shows it.
const CONFIG_HELP: &str = "\
The authorization config (--config, TOML; reloaded on SIGHUP, a file with an error keeps
the old rules). A pattern is a SPIFFE ID, or a prefix of IDs ending in /:

  # Service admins: namespaces, the epoch, force release; they administer every namespace.
  admins = [\"spiffe://example.org/ops/\"]

  [[namespace]]
  id = \"orders\"
  admins = [\"spiffe://example.org/orders/lead\"]   # its classes; its force releases

  [[namespace.grant]]                                # who may open sessions and lock...
  ids = [\"spiffe://example.org/orders/\"]
  classes = [\"jobs\", \"invoices\"]                 # ...these classes (\"*\": every class)

examples/authz.toml is a copy to start from.";

/// Flags of `palisade serve`.
#[derive(Debug, clap::Args)]
#[command(after_help = CONFIG_HELP)]
pub(crate) struct ServeArgs {
    /// etcd client endpoints (`http://host:port`, or `https://host:port` with
    /// --etcd-ca), comma-separated or repeated.
    #[arg(long, required = true, value_delimiter = ',')]
    etcd: Vec<String>,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// Address to listen on (the audit dashboard's default is 127.0.0.1:8090).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Authorization config (TOML, format below); reloaded on SIGHUP.
    #[arg(long)]
    config: PathBuf,
    /// The durable epoch record (a JSON file on a volume every replica shares); created
    /// on first start.
    #[arg(long)]
    epoch_file: PathBuf,
    /// Root prefix of the key space in etcd.
    #[arg(long, default_value = palisade_lock::DEFAULT_ROOT)]
    root: String,
    /// The name of the `--etcd` cluster's tier, the home tier: it holds the directory
    /// (which namespace lives on which tier) and serves namespaces of no other tier.
    #[arg(long, default_value = palisade_lock::DEFAULT_TIER)]
    home_tier: String,
    /// Another etcd cluster tier, `NAME=http://HOST:PORT[,http://HOST:PORT...]`
    /// (`https://` with --tier-ca NAME=FILE); repeated for more. Its durable epoch record
    /// is `<--epoch-file>.<NAME>`.
    #[arg(long = "tier", value_name = "NAME=ENDPOINTS")]
    tiers: Vec<String>,
    #[command(flatten)]
    tier_tls: TierTlsArgs,
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
    /// How many sessions one identity may have open at once, across every replica and
    /// tier (each is an etcd lease); past it, opening one answers 429 quota-exceeded.
    #[arg(long, default_value_t = palisade_server::DEFAULT_MAX_SESSIONS_PER_IDENTITY,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions_per_identity: u32,
    /// Log format on stderr: `text` (colours only on a terminal) or `json` (one object a
    /// line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// On SIGTERM or SIGINT, how long in-flight requests may take to finish before the
    /// process exits anyway, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    shutdown_grace_ms: u64,
    #[command(flatten)]
    listen_limits: Box<ListenArgs>,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
pub(crate) fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// A startup error: what was being done, with what, and why.
fn failed(what: String) -> impl FnOnce(&dyn std::error::Error) -> CliError {
    move |e| CliError::new(Exit::Failure, format!("{what}: {}", with_causes(e)))
}

/// Resolves on SIGTERM or SIGINT, naming it.
pub(crate) async fn stop_signal() -> &'static str {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// The durable epoch record of tier `name`: `<epoch_file>.<name>`.
fn tier_epoch_file(epoch_file: &std::path::Path, name: &str) -> PathBuf {
    let mut path = epoch_file.as_os_str().to_owned();
    path.push(format!(".{name}"));
    PathBuf::from(path)
}

pub(crate) fn run(args: ServeArgs) -> Result<String> {
    let home = etcd::home(&args.etcd, &args.etcd_tls)?;
    palisade_api::validate_name(&args.home_tier)
        .map_err(|e| CliError::bad_input(format!("--home-tier: {e}")))?;
    let tiers = etcd::tiers(&args.home_tier, &args.tiers, &args.tier_tls)?;
    let listening = listening(&args)?;
    epoch_dir(&args.epoch_file, "--epoch-file")?;
    init_logging(args.log_format);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(serve(args, home, tiers, listening))
}

/// Refuses an epoch file whose directory does not exist: the file could never be written
/// there, and a start that cannot read it would say NOT READY and blame the record.
fn epoch_dir(file: &std::path::Path, flag: &str) -> Result<()> {
    match file.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(CliError::bad_input(format!(
            "{flag} {}: its directory {} does not exist",
            file.display(),
            dir.display()
        ))
        .into()),
        _ => Ok(()),
    }
}

/// How the service authenticates its callers.
enum Listening {
    /// mTLS with this server config.
    Tls(Arc<rustls::ServerConfig>),
    /// The insecure dev identity header, on a loopback address.
    Dev,
}

/// The listening mode the flags ask for, checked before anything connects or is
/// written: certificate files that cannot be used, or dev mode on an address that is
/// not loopback, are bad input (exit 2).
fn listening(args: &ServeArgs) -> Result<Listening> {
    match (&args.tls_cert, &args.tls_key, &args.client_ca) {
        (Some(cert), Some(key), Some(ca)) => Ok(Listening::Tls(tls_config(cert, key, ca)?)),
        _ if args.insecure_dev_identity => {
            if args.listen.ip().is_loopback() {
                Ok(Listening::Dev)
            } else {
                Err(CliError::bad_input(format!(
                    "--listen {}: dev mode (--insecure-dev-identity) binds to loopback only",
                    args.listen
                ))
                .into())
            }
        }
        _ => Err(CliError::bad_input(
            "either --tls-cert/--tls-key/--client-ca or --insecure-dev-identity",
        )
        .into()),
    }
}

/// A tier's locker options: its endpoints, TLS, and the service's root.
fn locker_options(target: &EtcdTarget, root: &str) -> LockerOptions {
    let options = LockerOptions::new(target.endpoints.clone()).with_root(root);
    match &target.tls {
        Some(tls) => options.with_tls(tls.clone()),
        None => options,
    }
}

async fn serve(
    args: ServeArgs,
    home: EtcdTarget,
    other_tiers: Vec<(String, EtcdTarget)>,
    listening: Listening,
) -> Result<String> {
    let authz = Authz::load(&args.config).map_err(|e| CliError::bad_input(with_causes(&e)))?;
    // The address first: a start that cannot serve writes nothing to etcd (connecting a
    // locker moves the epoch reservation). Connections that arrive before the service
    // is up wait in the listen backlog.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| failed(format!("cannot listen on {}", args.listen))(&e))?;
    // Signals are taken from here on: a SIGTERM during the start still stops cleanly.
    let stop = tokio::spawn(stop_signal());
    let reload = authz.clone();
    tokio::spawn(async move {
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            if let Err(e) = reload.reload() {
                tracing::error!("authorization config not reloaded, the old one stays: {e}");
            }
        }
    });
    let locker = Locker::connect(
        locker_options(&home, &args.root),
        FileEpochStore::new(&args.epoch_file),
    )
    .await
    .map_err(|e| {
        if e.kind() == &palisade_lock::ErrorKind::EpochStore {
            failed(format!(
                "cannot use the epoch file {}",
                args.epoch_file.display()
            ))(&e)
        } else {
            home.unreachable(None, &e)
        }
    })?;
    if let (_, Some(mismatch)) = locker.epoch() {
        tracing::error!(
            "NOT READY: every grant is refused (503 epoch-mismatch, /readyz 503): {mismatch}. \
             If the epoch file {} was lost or is not the one the other replicas share, \
             point --epoch-file at the shared one; after an etcd restore or rehome, run \
             `palisade epoch advance --reason restore` (or rehome)",
            args.epoch_file.display()
        );
    }
    let mut tiers = vec![(args.home_tier.clone(), locker.clone())];
    for (name, target) in other_tiers {
        let file = tier_epoch_file(&args.epoch_file, &name);
        let tier = Locker::connect(
            locker_options(&target, &args.root),
            FileEpochStore::new(&file),
        )
        .await
        .map_err(|e| {
            if e.kind() == &palisade_lock::ErrorKind::EpochStore {
                failed(format!(
                    "cannot start tier {name}: cannot use its epoch file {}",
                    file.display()
                ))(&e)
            } else {
                target.unreachable(Some(&name), &e)
            }
        })?;
        if let (_, Some(mismatch)) = tier.epoch() {
            tracing::error!(
                "tier {name} NOT READY: its grants are refused (503 epoch-mismatch): {mismatch}. \
                 Check that the epoch file {} is the one the other replicas share",
                file.display()
            );
        }
        tiers.push((name, tier));
    }
    // Every tier's locker, to let the cleanups of the acquires that stopping ended finish.
    let lockers: Vec<Locker> = tiers.iter().map(|(_, l)| l.clone()).collect();
    let tiers = palisade_lock::Tiers::new(args.home_tier.clone(), tiers)
        .map_err(|e| CliError::bad_input(format!("--tier: {e}")))?;
    let mut options = ServiceOptions::new(authz)
        .with_max_sessions_per_identity(args.max_sessions_per_identity)
        .with_conn_limits(args.listen_limits.limits())
        .with_tiers(tiers);
    if let Some(database) = &args.database {
        let force = force_releases(database)
            .await
            .map_err(|e| failed("cannot use the --database for force release".into())(&*e))?;
        options = options.with_force_releases(force);
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = rx.await;
    };
    let addr = listener.local_addr()?;
    let serving: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = match listening {
        Listening::Tls(tls) => {
            announce(&format!("https://{addr}"), "mTLS");
            Box::pin(palisade_server::serve_tls_until(
                listener, tls, locker, options, shutdown,
            ))
        }
        Listening::Dev => {
            let serving = palisade_server::serve_dev_until(
                listener,
                locker,
                options.insecure_dev_identity(),
                shutdown,
            );
            announce(&format!("http://{addr}"), "dev mode");
            Box::pin(serving)
        }
    };
    tokio::pin!(serving);
    tokio::select! {
        r = &mut serving => r?,
        sig = stop => {
            let sig = sig.unwrap_or("a stop signal");
            let grace = Duration::from_millis(args.shutdown_grace_ms);
            tracing::info!("{sig}: no new connections; finishing in-flight requests (at most {} ms)", grace.as_millis());
            let _ = tx.send(());
            let started = tokio::time::Instant::now();
            match tokio::time::timeout(grace, serving).await {
                Ok(r) => r?,
                Err(_) => tracing::warn!("in-flight requests did not finish within {} ms; stopping anyway", grace.as_millis()),
            }
            // Acquires that stopped waiting withdraw their waiter keys in the background:
            // let them, within what is left of the grace period.
            let deadline = started + grace;
            for locker in &lockers {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if !locker.settle(left).await {
                    tracing::warn!("waiter keys of stopped acquires were not all withdrawn within the grace period; they end with their sessions");
                    break;
                }
            }
            tracing::info!("stopped");
        }
    }
    Ok(String::new())
}

/// The `listening on URL` line on stdout (a closed stdout does not stop the service),
/// and the same as a log event.
fn announce(url: &str, mode: &str) {
    tracing::info!(url, mode, "listening on {url}");
    let _ = super::output::emit(&format!("listening on {url}"));
}

fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    ca: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>> {
    // What is wrong with a file, named with its flag: bad input (exit 2).
    let unusable = |flag: &str, path: &std::path::Path, cause: String| {
        CliError::bad_input(format!(
            "cannot read the {flag} {}: {cause}",
            path.display()
        ))
    };
    let certificates = |flag: &str, path: &std::path::Path| {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|i| i.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| unusable(flag, path, with_causes(&e)))?;
        if certs.is_empty() {
            return Err(unusable(flag, path, "it holds no PEM certificate".into()));
        }
        Ok(certs)
    };
    let chain = certificates("--tls-cert", cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        let cause = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "it holds no PEM private key".into(),
            e => with_causes(&e),
        };
        unusable("--tls-key", key, cause)
    })?;
    let roots = certificates("--client-ca", ca)?;
    Ok(
        palisade_server::server_config(roots, chain, key_der).map_err(|e| {
            CliError::bad_input(format!(
                "the TLS certificate, key or CA is refused: {}",
                with_causes(&e)
            ))
        })?,
    )
}

/// Force release over `database`: the lock service's request table and the audit
/// trail's `force_release` table, both through the audit crate's pool (the lock crate
/// cannot depend on the audit crate, which depends on it, so the binary joins them).
async fn force_releases(database: &str) -> Result<ForceReleases> {
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
    ) -> palisade_lock::BoxFuture<
        '_,
        std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>,
    > {
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
