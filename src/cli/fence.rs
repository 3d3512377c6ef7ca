//! `palisade fence ...`: read a resource's high-water mark in its database, and lower one
//! that a mistaken token poisoned.
//!
//! `show` reads `fence_high_water` and the resource's last resets (`fence_reset_log`).
//! `reset` calls `fence_reset` (it only lowers, to a token you name, needs a reason, and
//! logs itself in the resource's database) and then records the reset in the audit
//! trail, which must exist already. Exit codes: 2 for a refused reset (a reason that is
//! empty, blank, over 1024 bytes or holds a control character; a token not below the mark;
//! an audit database without an audit trail),
//! 3 when the resource has no mark.

use palisade_fence::postgres::{read_resets, MarkReset};
use palisade_fence::{read_mark, reset_mark, FenceErrorKind, FencingToken};

use super::exit::{CliError, Exit, Result};

/// `palisade fence`.
#[derive(Debug, clap::Args)]
pub(crate) struct FenceArgs {
    /// The resource's database (where `fence_high_water` is): a libpq connection string,
    /// key/value or URL form.
    #[arg(long, env = "PALISADE_FENCE_DATABASE")]
    database: String,
    #[command(subcommand)]
    cmd: FenceCommand,
}

#[derive(Debug, clap::Subcommand)]
enum FenceCommand {
    /// Print RESOURCE's mark (token, epoch, revision, last change) and its last resets.
    Show {
        /// The resource key, as the fence layer or the SQL helper names it.
        resource: String,
        /// How many of the last resets to print.
        #[arg(long, default_value_t = 5)]
        resets: i64,
    },
    /// Lower RESOURCE's mark to --to, for --reason; recorded in the resource's database
    /// and in the audit trail. Name the token of the lock's current (or last) hold: every
    /// older holder stays refused.
    Reset {
        /// The resource key.
        resource: String,
        /// The new mark: a decimal token below the current mark.
        #[arg(long)]
        to: String,
        /// Why (kept in both records): 1 to 1024 bytes, not blank, no control character.
        #[arg(long)]
        reason: String,
        /// The audit database, where the reset is recorded.
        #[arg(long, env = "PALISADE_AUDIT_DATABASE")]
        audit_database: String,
        /// Who resets (kept in the audit trail); defaults to $USER, else $LOGNAME, else
        /// the database role that ran the reset.
        #[arg(long)]
        actor: Option<String>,
    },
}

pub(crate) fn run(args: FenceArgs) -> Result<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let resource = match &args.cmd {
        FenceCommand::Show { resource, .. } | FenceCommand::Reset { resource, .. } => resource,
    };
    if resource.is_empty() {
        return Err(CliError::bad_input("RESOURCE is empty: name the resource key").into());
    }
    let config: tokio_postgres::Config = args.database.parse().map_err(|e| {
        CliError::bad_input(format!(
            "--database is not a connection string: {}",
            super::exit::with_causes(&e)
        ))
    })?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(CliError::bad_input(
            "--database names no host: give one, as in host=127.0.0.1 user=postgres dbname=app",
        )
        .into());
    }
    runtime.block_on(async move {
        // The server's own message ("database \"x\" does not exist") is a cause.
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| {
                CliError::new(
                    Exit::Failure,
                    format!("resource database: {}", super::exit::with_causes(&e)),
                )
            })?;
        tokio::spawn(connection);
        match args.cmd {
            FenceCommand::Show { resource, resets } => show(&client, &resource, resets).await,
            FenceCommand::Reset {
                resource,
                to,
                reason,
                audit_database,
                actor,
            } => {
                let to: FencingToken = to
                    .parse()
                    .map_err(|e| CliError::bad_input(format!("--to {to:?}: {e}")))?;
                palisade_api::validate_text("--reason", &reason, palisade_api::MAX_REASON_LEN)
                    .map_err(|e| CliError::bad_input(e.to_string()))?;
                // Reach the audit trail before changing anything, so a reset is not left
                // unrecorded for want of a connection.
                let pool = palisade_audit::pool(&audit_database, 1)?;
                let mut audit = pool.get().await.map_err(|e| {
                    CliError::new(
                        Exit::Failure,
                        format!("audit database: {}", super::exit::with_causes(&e)),
                    )
                })?;
                // The record goes into an audit trail that exists: a mistyped
                // --audit-database must not grow one of its own there, unread.
                if !has_audit_trail(&audit).await? {
                    return Err(CliError::bad_input(
                        "--audit-database has no audit trail (no audit_schema_migrations table): \
                         name the database that `palisade audit tail` writes to",
                    )
                    .into());
                }
                palisade_audit::migrate_client(&mut audit).await?;
                let old = reset_mark(&client, &resource, to, &reason)
                    .await
                    .map_err(|e| match e.kind() {
                        FenceErrorKind::BadReset => CliError::bad_input(e.to_string()),
                        FenceErrorKind::NoMark => CliError::new(Exit::NotFound, e.to_string()),
                        _ => db_failure(&format!("resetting the mark of {resource}"), &e),
                    })?;
                let from_env = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
                let actor = match actor.or_else(|| from_env("USER")).or_else(|| from_env("LOGNAME")) {
                    Some(actor) => actor,
                    // The role that ran the reset, as fence_reset_log records it.
                    None => client
                        .query_one("SELECT current_user::text", &[])
                        .await
                        .map_or_else(|_| "unknown".to_owned(), |row| row.get(0)),
                };
                let record = palisade_audit::FenceReset::new(&resource, old, to, &reason, actor);
                palisade_audit::insert_fence_reset(&**audit, &record)
                    .await
                    .map_err(|e| {
                        CliError::new(
                            Exit::Failure,
                            format!(
                                "{resource}: mark reset from {old} to {to} (logged in fence_reset_log), \
                                 but not recorded in the audit trail: {e}"
                            ),
                        )
                    })?;
                Ok(format!(
                    "{resource}: mark reset from {old} to {to}\nrecorded in the audit trail as {}",
                    record.id
                ))
            }
        }
    })
}

async fn show(client: &tokio_postgres::Client, resource: &str, resets: i64) -> Result<String> {
    let mark = read_mark(client, resource)
        .await
        .map_err(|e| db_failure(&format!("reading the mark of {resource}"), &e))?;
    let Some(mark) = mark else {
        return Err(CliError::new(Exit::NotFound, format!("{resource} has no mark")).into());
    };
    let mut out = format!(
        "resource {resource}\nmark {} (epoch {}, revision {})\nupdated {}",
        mark.token,
        mark.token.epoch(),
        mark.token.revision(),
        humantime::format_rfc3339_seconds(mark.updated_at)
    );
    let log = read_resets(client, resource, resets)
        .await
        .map_err(|e| db_failure(&format!("reading the resets of {resource}"), &e))?;
    for MarkReset {
        old,
        new,
        reason,
        reset_by,
        reset_at,
        ..
    } in log
    {
        out.push_str(&format!(
            "\nreset {} by {}: {old} -> {new} ({})",
            humantime::format_rfc3339_seconds(reset_at),
            one_line(&reset_by),
            one_line(&reason),
        ));
    }
    Ok(out)
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), so a stored reason or
/// role, which SQL may have written, prints as one line and cannot drive the terminal.
fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(char::is_control) {
        std::borrow::Cow::Owned(
            text.chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect(),
        )
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Whether the database behind `client` holds an audit trail (its migrations table).
async fn has_audit_trail(client: &tokio_postgres::Client) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT to_regclass('audit_schema_migrations') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|e| {
            CliError::new(
                Exit::Failure,
                format!("audit database: {}", super::exit::with_causes(&e)),
            )
        })?;
    Ok(row.get(0))
}

/// A database failure with every cause (the server's own message included), and what to
/// do when the database has no fence tables at all.
fn db_failure(what: &str, e: &palisade_fence::FenceError) -> CliError {
    let undefined = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
        .and_then(tokio_postgres::Error::code)
        .is_some_and(|c| {
            *c == tokio_postgres::error::SqlState::UNDEFINED_TABLE
                || *c == tokio_postgres::error::SqlState::UNDEFINED_FUNCTION
                || *c == tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME
        });
    let mut text = match std::error::Error::source(e) {
        Some(cause) => format!("{what}: {}", super::exit::with_causes(cause)),
        None => format!("{what}: {e}"),
    };
    if undefined {
        text.push_str(
            " (this database has no fence tables: --database must name the resource's \
             database, migrated by palisade_fence::migrate or the SQL in crates/fence/migrations)",
        );
    }
    CliError::new(Exit::Failure, text)
}
