//! `palisade audit …`: the audit dashboard server.

use std::error::Error;
use std::net::SocketAddr;

use clap::{Args, Subcommand};

/// Audit subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Serve the audit dashboard (HTML and JSON under /api/) until interrupted.
    ///
    /// Applies the audit schema's migrations first. Prints the address it listens on.
    Serve(ServeArgs),
}

/// Arguments of `palisade audit serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The audit database: a libpq connection string, key/value or URL form.
    #[arg(long)]
    database: String,
}

/// Runs an audit subcommand; returns what to print when it ends.
pub(crate) fn run(command: AuditCommand) -> Result<String, Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match command {
        AuditCommand::Serve(args) => runtime.block_on(serve(args)),
    }
}

async fn serve(args: ServeArgs) -> Result<String, Box<dyn Error>> {
    let pool = palisade_audit::pool(&args.database, 8)?;
    palisade_audit::migrate(&pool).await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("palisade audit dashboard on http://{}/", listener.local_addr()?);
    axum::serve(listener, palisade_audit::dashboard::router(pool))
        .with_graceful_shutdown(interrupted())
        .await?;
    Ok(String::new())
}

/// Resolves on Ctrl-C, or SIGTERM on Unix.
async fn interrupted() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        return;
    }
    let _ = tokio::signal::ctrl_c().await;
}
