//! The store that `palisade fence show` and `fence reset` read and lower a mark in, named
//! by `--database` (a libpq connection string: Postgres) or by `--store URL`, whose scheme
//! picks the store: `postgres://` or `postgresql://`, `redis://` or `rediss://`, `mysql://`
//! or `mariadb://`.
//!
//! Every store answers the same four questions: the mark, its last resets, a reset (which
//! the store checks and logs itself), and who the store says ran it (the actor of the
//! audit record: the identity the store authenticated, never a name the caller types).

use palisade_fence::{FenceErrorKind, FencingToken, Mark, MarkReset, ResetGuard};

use super::exit::{with_causes, CliError, Exit, Result};

/// Where the marks are, parsed and checked before anything connects.
#[derive(Debug)]
pub(crate) enum StoreTarget {
    Postgres(tokio_postgres::Config),
}

impl StoreTarget {
    /// `--database` (Postgres) or `--store URL`; exactly one is needed (clap refuses both).
    pub(crate) fn parse(database: Option<&str>, store: Option<&str>) -> Result<StoreTarget> {
        match (database, store) {
            (Some(database), _) => postgres_target("--database", database),
            (None, Some(url)) => {
                let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                match scheme.as_deref() {
                    Some("postgres" | "postgresql") => postgres_target("--store", url),
                    _ => Err(CliError::bad_input(format!(
                        "--store {:?}: name the store by its URL's scheme: postgres://, \
                         redis:// (rediss://) or mysql:// (mariadb://)",
                        redacted(url)
                    ))
                    .into()),
                }
            }
            (None, None) => Err(CliError::bad_input(
                "--store URL (or --database, PALISADE_FENCE_STORE, PALISADE_FENCE_DATABASE) \
                 is needed: the resource's store",
            )
            .into()),
        }
    }
}

fn postgres_target(flag: &str, text: &str) -> Result<StoreTarget> {
    let config: tokio_postgres::Config = text.parse().map_err(|e| {
        CliError::bad_input(format!(
            "{flag} is not a connection string: {}",
            with_causes(&e)
        ))
    })?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(CliError::bad_input(format!(
            "{flag} names no host: give one, as in host=127.0.0.1 user=postgres dbname=app"
        ))
        .into());
    }
    Ok(StoreTarget::Postgres(config))
}

/// `url` without its password, for an error message.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

/// A connection to the store.
pub(crate) enum MarkStore {
    Postgres(tokio_postgres::Client),
}

impl MarkStore {
    /// Connects; the server's own refusal is the cause.
    pub(crate) async fn open(target: StoreTarget) -> Result<MarkStore> {
        match target {
            StoreTarget::Postgres(config) => {
                let (client, connection) =
                    config.connect(tokio_postgres::NoTls).await.map_err(|e| {
                        CliError::new(
                            Exit::Failure,
                            format!("resource database: {}", with_causes(&e)),
                        )
                    })?;
                tokio::spawn(connection);
                Ok(MarkStore::Postgres(client))
            }
        }
    }

    /// `resource`'s mark; `None` when it has none.
    pub(crate) async fn mark(&mut self, resource: &str) -> Result<Option<Mark>> {
        match self {
            MarkStore::Postgres(client) => palisade_fence::read_mark(client, resource)
                .await
                .map_err(|e| pg_failure(&format!("reading the mark of {resource}"), &e).into()),
        }
    }

    /// The last `limit` resets of `resource`, newest first.
    pub(crate) async fn resets(&mut self, resource: &str, limit: i64) -> Result<Vec<MarkReset>> {
        match self {
            MarkStore::Postgres(client) => {
                palisade_fence::postgres::read_resets(client, resource, limit)
                    .await
                    .map_err(|e| {
                        pg_failure(&format!("reading the resets of {resource}"), &e).into()
                    })
            }
        }
    }

    /// Lowers `resource`'s mark to `to` with the store's own reset; the mark it replaced.
    /// A refusal is exit 2, no mark exit 3.
    pub(crate) async fn reset(
        &mut self,
        resource: &str,
        to: FencingToken,
        reason: &str,
        guard: &ResetGuard,
    ) -> Result<FencingToken> {
        match self {
            MarkStore::Postgres(client) => {
                palisade_fence::postgres::reset_mark_guarded(client, resource, to, reason, guard)
                    .await
                    .map_err(|e| {
                        match e.kind() {
                            FenceErrorKind::BadReset => CliError::bad_input(e.to_string()),
                            FenceErrorKind::NoMark => CliError::new(Exit::NotFound, e.to_string()),
                            _ => pg_failure(&format!("resetting the mark of {resource}"), &e),
                        }
                        .into()
                    })
            }
        }
    }

    /// Who the store logs a reset as: the identity it authenticated.
    pub(crate) async fn actor(&mut self) -> std::result::Result<String, String> {
        match self {
            // fence_reset logs session_user, the role that logged in.
            MarkStore::Postgres(client) => client
                .query_one("SELECT session_user::text", &[])
                .await
                .map(|row| row.get(0))
                .map_err(|e| with_causes(&e)),
        }
    }
}

/// A database failure with every cause (the server's own message included), and what to
/// do when the database has no fence tables at all.
fn pg_failure(what: &str, e: &palisade_fence::FenceError) -> CliError {
    let undefined = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
        .and_then(tokio_postgres::Error::code)
        .is_some_and(|c| {
            *c == tokio_postgres::error::SqlState::UNDEFINED_TABLE
                || *c == tokio_postgres::error::SqlState::UNDEFINED_FUNCTION
                || *c == tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME
        });
    let mut text = match std::error::Error::source(e) {
        Some(cause) => format!("{what}: {}", with_causes(cause)),
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
