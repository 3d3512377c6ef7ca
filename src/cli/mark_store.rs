//! The store that `palisade fence show` and `fence reset` read and lower a mark in, named
//! by `--database` (a libpq connection string: Postgres) or by `--store URL`, whose scheme
//! picks the store: `postgres://` or `postgresql://`, `redis://`, `mysql://` or
//! `mariadb://`.
//!
//! Every store answers the same four questions: the mark, its last resets, a reset (which
//! the store checks and logs itself), and who the store says ran it (the actor of the
//! audit record: the identity the store authenticated, never a name the caller types).

use palisade_fence::{FenceErrorKind, FencingToken, Mark, MarkReset, ResetGuard};

use super::exit::{with_causes, CliError, Exit, Result};

/// Where the marks are, parsed and checked before anything connects.
// Made once per process and consumed at once: boxing the larger variant saves nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum StoreTarget {
    Postgres(tokio_postgres::Config),
    Redis(String, palisade_fence::redis::KeyLayout),
    Mysql(mysql_async::Opts),
}

impl StoreTarget {
    /// `--database` (Postgres) or `--store URL`; exactly one is needed (clap refuses both).
    /// `redis_prefix` is the key prefix of a Redis store's marks.
    pub(crate) fn parse(
        database: Option<&str>,
        store: Option<&str>,
        redis_prefix: String,
    ) -> Result<StoreTarget> {
        match (database, store) {
            (Some(database), _) => postgres_target("--database", database),
            (None, Some(url)) => {
                let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                match scheme.as_deref() {
                    Some("postgres" | "postgresql") => postgres_target("--store", url),
                    Some("redis") => {
                        redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
                            CliError::bad_input(format!(
                                "--store {:?} is not a Redis URL: {e}",
                                redacted(url)
                            ))
                        })?;
                        let layout = palisade_fence::redis::KeyLayout::new(redis_prefix)
                            .map_err(|e| CliError::bad_input(format!("--redis-prefix: {e}")))?;
                        Ok(StoreTarget::Redis(url.to_owned(), layout))
                    }
                    Some("mysql" | "mariadb") => {
                        // mysql_async reads only the mysql:// scheme.
                        let text = match url.strip_prefix("mariadb://") {
                            Some(rest) => format!("mysql://{rest}"),
                            None => url.to_owned(),
                        };
                        let opts = mysql_async::Opts::from_url(&text).map_err(|e| {
                            CliError::bad_input(format!(
                                "--store {:?} is not a MySQL URL: {e}",
                                redacted(url)
                            ))
                        })?;
                        if opts.db_name().is_none() {
                            return Err(CliError::bad_input(format!(
                                "--store {:?} names no database: give the one the fence was \
                                 migrated into, as in mysql://user@host:3306/app",
                                redacted(url)
                            ))
                            .into());
                        }
                        Ok(StoreTarget::Mysql(opts))
                    }
                    _ => Err(CliError::bad_input(format!(
                        "--store {:?}: name the store by its URL's scheme: postgres://, \
                         redis:// or mysql:// (mariadb://)",
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
    Redis(palisade_fence::RedisStore),
    Mysql(mysql_async::Conn),
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
            StoreTarget::Redis(url, layout) => palisade_fence::RedisStore::connect(&url)
                .await
                .map(|store| MarkStore::Redis(store.with_layout(layout)))
                .map_err(|e| {
                    CliError::new(
                        Exit::Failure,
                        format!("resource Redis: {}", with_causes(&e)),
                    )
                    .into()
                }),
            StoreTarget::Mysql(opts) => mysql_async::Conn::new(opts)
                .await
                .map(MarkStore::Mysql)
                .map_err(|e| {
                    CliError::new(
                        Exit::Failure,
                        format!("resource database: {}", with_causes(&e)),
                    )
                    .into()
                }),
        }
    }

    /// `resource`'s mark; `None` when it has none.
    pub(crate) async fn mark(&mut self, resource: &str) -> Result<Option<Mark>> {
        match self {
            MarkStore::Postgres(client) => palisade_fence::read_mark(client, resource)
                .await
                .map_err(|e| pg_failure(&format!("reading the mark of {resource}"), &e).into()),
            MarkStore::Redis(store) => store
                .mark(resource)
                .await
                .map_err(|e| failure(&format!("reading the mark of {resource}"), &e).into()),
            MarkStore::Mysql(conn) => palisade_fence::mysql::read_mark(conn, resource)
                .await
                .map_err(|e| failure(&format!("reading the mark of {resource}"), &e).into()),
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
            MarkStore::Redis(store) => store
                .resets(resource, limit)
                .await
                .map_err(|e| failure(&format!("reading the resets of {resource}"), &e).into()),
            MarkStore::Mysql(conn) => palisade_fence::mysql::read_resets(conn, resource, limit)
                .await
                .map_err(|e| failure(&format!("reading the resets of {resource}"), &e).into()),
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
            MarkStore::Redis(store) => {
                use palisade_fence::redis::RedisFenceErrorKind as Kind;
                store.reset(resource, to, reason, guard).await.map_err(|e| {
                    match e.kind() {
                        Kind::BadReset => CliError::bad_input(e.to_string()),
                        Kind::NoMark => CliError::new(Exit::NotFound, e.to_string()),
                        _ => failure(&format!("resetting the mark of {resource}"), &e),
                    }
                    .into()
                })
            }
            MarkStore::Mysql(conn) => {
                use palisade_fence::mysql::MysqlFenceErrorKind as Kind;
                palisade_fence::mysql::reset_mark_guarded(conn, resource, to, reason, guard)
                    .await
                    .map_err(|e| {
                        match e.kind() {
                            Kind::BadReset => CliError::bad_input(e.to_string()),
                            Kind::NoMark => CliError::new(Exit::NotFound, e.to_string()),
                            _ => failure(&format!("resetting the mark of {resource}"), &e),
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
            // The reset logs the connection's ACL user, which the CLI reads the same way.
            MarkStore::Redis(store) => redis::cmd("ACL")
                .arg("WHOAMI")
                .query_async(&mut store.connection())
                .await
                .map_err(|e| with_causes(&e)),
            // fence_reset logs USER(), the account that logged in (not the definer).
            MarkStore::Mysql(conn) => {
                use mysql_async::prelude::Queryable;
                conn.query_first::<String, _>("SELECT USER()")
                    .await
                    .map_err(|e| with_causes(&e))?
                    .ok_or_else(|| "SELECT USER() returned no row".to_owned())
            }
        }
    }
}

/// A store's failure with every cause.
fn failure(what: &str, e: &dyn std::error::Error) -> CliError {
    CliError::new(Exit::Failure, format!("{what}: {}", with_causes(e)))
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
