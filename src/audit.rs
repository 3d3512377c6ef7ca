//! `palisade audit …`: the audit dashboard server and the lock-event tailer.

use std::error::Error;
use std::net::SocketAddr;

use clap::{Args, Subcommand};

use palisade_audit::dashboard::Access;
use palisade_lock::EtcdTls;

use crate::cli::etcd::{self, EtcdTlsArgs, TierTlsArgs};
use crate::cli::listen::ListenArgs;

/// Audit subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Serve the audit dashboard (HTML and JSON under /api/) until interrupted.
    ///
    /// Applies the audit schema's migrations first. Prints the address it listens on.
    /// Connections are bounded as `palisade serve`'s (--max-connections,
    /// --header-timeout-ms, ...): an idle or slow client is closed, and running out of
    /// file descriptors is logged and retried.
    Serve(ServeArgs),
    /// Tail the lock key space in etcd into the audit database until interrupted.
    ///
    /// Applies the audit schema's migrations first, then goes on from the last revision
    /// stored for the etcd cluster. etcd or database failures are retried with a backoff.
    Tail(TailArgs),
}

/// Arguments of `palisade audit tail`.
#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    /// etcd client endpoint (`http://host:port`, or `https://host:port` with --etcd-ca);
    /// repeat for several members.
    #[arg(long = "etcd", required = true)]
    etcd: Vec<String>,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// Another etcd cluster tier to tail as well, `NAME=http://HOST:PORT[,...]`; repeat
    /// for more (as `palisade serve --tier`, TLS with --tier-ca). Each cluster is tailed
    /// on its own, its rows keyed by its cluster id.
    #[arg(long = "tier", value_name = "NAME=ENDPOINTS")]
    tiers: Vec<String>,
    #[command(flatten)]
    tier_tls: TierTlsArgs,
    /// The root prefix of the lock key space.
    #[arg(long, default_value = "/palisade/")]
    root: String,
    /// The audit database: a libpq connection string, key/value or URL form.
    #[arg(long)]
    database: String,
}

/// Arguments of `palisade audit serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the lock service's default is
    /// 127.0.0.1:8080).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// The audit database: a libpq connection string, key/value or URL form.
    #[arg(long)]
    database: String,
    /// etcd client endpoint (`http://host:port`, or `https://host:port` with
    /// --etcd-ca), repeat for several members: the overview then shows holds and waiters
    /// now, and the timeline each namespace's tier. Read only. Without it those show as
    /// unknown.
    #[arg(long = "etcd")]
    etcd: Vec<String>,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// The root prefix of the lock key space (with `--etcd`).
    #[arg(long, default_value = "/palisade/")]
    root: String,
    #[command(flatten)]
    listen_limits: Box<ListenArgs>,
    /// Also answer requests for this host name (as clients put it in `Host`, without
    /// port); repeat for more. The dashboard answers only its listen address, plus
    /// `localhost`, `127.0.0.1` and `::1` when that is a loopback or unspecified
    /// address; any other host is refused with 403 (a guard against DNS rebinding).
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// Require `Authorization: Bearer <token>` on every request, the token read from
    /// this file (white space at either end ignored; never pass it on the command
    /// line). Without it, a dashboard on a non-loopback address warns at start: anyone
    /// who reaches it reads the audit trail.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
}

/// Runs an audit subcommand; returns what to print when it ends.
pub(crate) fn run(command: AuditCommand) -> Result<String, Box<dyn Error>> {
    // The tailer's and the dashboard's warnings (an etcd or database failure they retry)
    // go to stderr, as `palisade serve`'s.
    crate::cli::serve::init_logging(crate::cli::serve::LogFormat::Text);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match command {
        AuditCommand::Serve(args) => runtime.block_on(serve(args)),
        AuditCommand::Tail(args) => runtime.block_on(tail(args)),
    }
}

/// The dashboard's Host allow-list and bearer token, from the flags.
fn access(args: &ServeArgs, listen: SocketAddr) -> Result<Access, Box<dyn Error>> {
    let mut access = Access::for_listen_addr(listen);
    for host in &args.allow_hosts {
        access = access
            .with_host(host)
            .map_err(|e| format!("--allow-host: {e}"))?;
    }
    if let Some(path) = &args.token_file {
        let token = std::fs::read_to_string(path)
            .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        access = access
            .with_bearer_token(&token)
            .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
    }
    if !listen.ip().is_loopback() && !access.has_token() {
        tracing::warn!(
            %listen,
            "the audit dashboard listens on a non-loopback address without --token-file: \
             anyone who reaches it reads the audit trail"
        );
    }
    Ok(access)
}

async fn serve(args: ServeArgs) -> Result<String, Box<dyn Error>> {
    let access = access(&args, args.listen)?;
    let pool = palisade_audit::pool(&args.database, 8)?;
    palisade_audit::migrate(&pool).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    // A closed stdout does not stop the dashboard.
    let _ = crate::cli::output::emit(&format!(
        "palisade audit dashboard on http://{}/",
        listener.local_addr()?
    ));
    let app = if args.etcd.is_empty() {
        palisade_audit::dashboard::router(pool)
    } else {
        let etcd = etcd::home(&args.etcd, &args.etcd_tls)?;
        let live = palisade_audit::dashboard::Live::connect(
            &etcd.endpoints,
            etcd.tls.as_ref().map(EtcdTls::tls_options),
            &args.root,
        )
        .await
        .map_err(|e| etcd.unreachable(None, &e))?;
        palisade_audit::dashboard::router_with_live(pool, live)
    };
    let app = access.protect(app);
    palisade_listen::serve(
        listener,
        palisade_listen::Transport::Plain,
        args.listen_limits.limits(),
        move |_: &palisade_listen::Peer| app.clone(),
        interrupted(),
    )
    .await;
    Ok(String::new())
}

async fn tail(args: TailArgs) -> Result<String, Box<dyn Error>> {
    let mut clusters = vec![(None, etcd::home(&args.etcd, &args.etcd_tls)?)];
    // The tier names pair the TLS flags with their tier and name it in errors: the
    // tailer keys rows by cluster id, and `palisade serve`'s --home-tier is not known here.
    let tiers = etcd::tiers("", &args.tiers, &args.tier_tls)?;
    clusters.extend(tiers.into_iter().map(|(name, target)| (Some(name), target)));
    let pool = palisade_audit::pool(&args.database, 2 * clusters.len())?;
    palisade_audit::migrate(&pool).await?;
    let mut tailers = tokio::task::JoinSet::new();
    for (name, cluster) in &clusters {
        let tailer = palisade_audit::Tailer::connect(
            &cluster.endpoints,
            cluster.tls.as_ref().map(EtcdTls::tls_options),
            pool.clone(),
        )
        .await
        .map_err(|e| cluster.unreachable(name.as_deref(), &e))?
        .with_root(args.root.clone());
        tailers.spawn(tailer.run());
    }
    let all: Vec<String> = clusters.iter().map(|(_, c)| c.joined()).collect();
    let _ = crate::cli::output::emit(&format!("palisade audit tailer on {}", all.join(" and ")));
    interrupted().await;
    tailers.abort_all();
    Ok(String::new())
}

/// Resolves on Ctrl-C, or SIGTERM on Unix.
async fn interrupted() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        return;
    }
    let _ = tokio::signal::ctrl_c().await;
}
