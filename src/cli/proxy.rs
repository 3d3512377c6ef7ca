//! `palisade fence proxy`: the fencing reverse proxy in front of one upstream.
//!
//! With `--config FILE` the file says everything (see `docs/proxy.md`); SIGHUP reads it
//! again, and a file that does not parse, or that changes what needs a restart, is
//! refused with its error while the running config keeps serving. Without it,
//! `--listen`, `--upstream` and `--policy` make a one-route proxy (memory store, or
//! the fence's `--database`). SIGTERM or SIGINT drains requests in flight, then exits.

use std::path::PathBuf;

use palisade_proxy::{Proxy, ProxyConfig, StoreConfig, DEFAULT_CAPACITY};
use tokio::signal::unix::{signal, SignalKind};

use super::exit::{with_causes, CliError, Exit, Result};
use super::serve::{init_logging, stop_signal, LogFormat};

/// `palisade fence proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    /// The config file (TOML): listen address, upstream, routes, store, timeouts, audit.
    #[arg(long, conflicts_with_all = ["listen", "upstream", "policy", "admin_listen"])]
    config: Option<PathBuf>,
    /// Where clients connect (IP:PORT), without --config.
    #[arg(long, requires = "upstream")]
    listen: Option<String>,
    /// The service behind the proxy (`http://host:port`), without --config.
    #[arg(long, requires = "listen")]
    upstream: Option<String>,
    /// What every write gets, without --config: fenced (a current token or refused),
    /// advisory (through; a write without one is recorded) or open (nothing checked).
    #[arg(long, default_value = "fenced")]
    policy: String,
    /// Where /livez, /readyz and /metrics are served (IP:PORT), without --config.
    #[arg(long)]
    admin_listen: Option<String>,
    /// Log format on stderr: `json` (one object per line) or `text`.
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
}

/// Runs the proxy; `database` is the fence's `--database`, the store of the flags case.
pub(crate) fn run(args: ProxyArgs, database: Option<String>) -> Result<String> {
    let config = match &args.config {
        Some(path) => {
            if database.is_some() {
                return Err(CliError::bad_input(
                    "--database (or PALISADE_FENCE_DATABASE) with --config: the store is the file's [store]",
                )
                .into());
            }
            ProxyConfig::load(path).map_err(|e| CliError::bad_input(e.to_string()))?
        }
        None => {
            let (Some(listen), Some(upstream)) = (&args.listen, &args.upstream) else {
                return Err(CliError::bad_input(
                    "name the upstream: --config FILE, or --listen IP:PORT --upstream http://HOST:PORT",
                )
                .into());
            };
            let store = match database {
                Some(database) => StoreConfig::Postgres { database },
                None => StoreConfig::Memory {
                    capacity: DEFAULT_CAPACITY,
                },
            };
            let mut config = ProxyConfig::from_flags(listen, upstream, &args.policy, store)
                .map_err(|e| CliError::bad_input(e.to_string()))?;
            if let Some(admin) = &args.admin_listen {
                config.admin = Some(admin.parse().map_err(|_| {
                    CliError::bad_input(format!(
                        "--admin-listen: `{admin}` is not an IP:PORT address"
                    ))
                })?);
            }
            config
        }
    };
    init_logging(args.log_format);
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let proxy = Proxy::bind(config)
            .await
            .map_err(|e| CliError::new(Exit::Failure, with_causes(&e)))?;
        tracing::info!(
            listen = %proxy.local_addr(),
            admin = %proxy.admin_addr().map(|a| a.to_string()).unwrap_or_default(),
            "fencing proxy serving"
        );
        if let Some(path) = args.config.clone() {
            let reloader = proxy.reloader();
            tokio::spawn(async move {
                let Ok(mut hup) = signal(SignalKind::hangup()) else {
                    return;
                };
                while hup.recv().await.is_some() {
                    let outcome = ProxyConfig::load(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|c| reloader.reload(c).map_err(|e| e.to_string()));
                    match outcome {
                        Ok(()) => tracing::info!(config = %path.display(), "config reloaded"),
                        Err(e) => tracing::error!(config = %path.display(), "config not reloaded, the running one keeps serving: {e}"),
                    }
                }
            });
        }
        let drained = proxy
            .run(async {
                let name = stop_signal().await;
                tracing::info!("{name}: stopping");
            })
            .await;
        if drained {
            Ok(String::new())
        } else {
            Err(CliError::new(Exit::Failure, "requests were still in flight when the drain time ran out").into())
        }
    })
}
