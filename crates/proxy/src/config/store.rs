//! The `[store]` table: where the high-water marks live.
//!
//! ```toml
//! [store]
//! kind = "memory"      # the default; capacity = 100000
//! kind = "postgres"    # database = "<libpq connection string>"
//! kind = "redis"       # url = "redis://host:6379"; prefix = "palisade:fence:" (the default)
//! kind = "mysql"       # url = "mysql://user@host:3306/database" (MySQL or MariaDB)
//! ```
//!
//! A field that another kind takes is refused, naming the kind that takes it.

use serde::Deserialize;
use toml::Spanned;

use super::{At, ConfigError, StoreConfig, DEFAULT_CAPACITY};

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    kind: Option<Spanned<String>>,
    capacity: Option<Spanned<u64>>,
    database: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    prefix: Option<Spanned<String>>,
}

/// The kinds, with the field each one needs besides `kind`.
const KINDS: &str = "memory, postgres, redis or mysql";

pub(super) fn parse(at: &At<'_>, raw: &RawStore) -> Result<StoreConfig, ConfigError> {
    let kind = raw.kind.as_ref().map(|k| k.get_ref().as_str());
    let name = kind.unwrap_or("memory");
    // Each field belongs to one kind (or two, for url).
    let misplaced = |field: &str, owner: &str| {
        format!("a {name} store has no {field}; it is for kind = {owner}")
    };
    if let Some(c) = &raw.capacity {
        if name != "memory" {
            return Err(at.err(c, "store.capacity", misplaced("capacity", "\"memory\"")));
        }
    }
    if let Some(d) = &raw.database {
        if name != "postgres" {
            return Err(at.err(d, "store.database", misplaced("database", "\"postgres\"")));
        }
    }
    if let Some(u) = &raw.url {
        if !matches!(name, "redis" | "mysql") {
            return Err(at.err(u, "store.url", misplaced("url", "\"redis\" or \"mysql\"")));
        }
    }
    if let Some(p) = &raw.prefix {
        if name != "redis" {
            return Err(at.err(p, "store.prefix", misplaced("prefix", "\"redis\"")));
        }
        palisade_fence::redis::KeyLayout::new(p.get_ref().as_str())
            .map_err(|e| at.err(p, "store.prefix", e.to_string()))?;
    }
    match kind {
        None | Some("memory") => {
            let capacity = raw
                .capacity
                .as_ref()
                .map_or(DEFAULT_CAPACITY, |c| *c.get_ref());
            if let Some(c) = raw.capacity.as_ref().filter(|_| capacity == 0) {
                return Err(at.err(c, "store.capacity", "must be at least 1"));
            }
            Ok(StoreConfig::Memory { capacity })
        }
        Some("postgres") => {
            let spanned = raw.kind.as_ref().expect("kind was given");
            let Some(database) = &raw.database else {
                return Err(at.err(
                    spanned,
                    "store.database",
                    "kind = \"postgres\" needs database = \"<libpq connection string>\"",
                ));
            };
            database
                .get_ref()
                .parse::<tokio_postgres::Config>()
                .map_err(|e| {
                    at.err(
                        database,
                        "store.database",
                        format!("not a libpq connection string: {e}"),
                    )
                })?;
            Ok(StoreConfig::Postgres {
                database: database.get_ref().clone(),
            })
        }
        Some(k @ ("redis" | "mysql")) => {
            let spanned = raw.kind.as_ref().expect("kind was given");
            let schemes: &[&str] = if k == "redis" {
                &["redis"]
            } else {
                &["mysql", "mariadb"]
            };
            let Some(url) = &raw.url else {
                return Err(at.err(
                    spanned,
                    "store.url",
                    format!("kind = \"{k}\" needs url = \"{}://host:port…\"", schemes[0]),
                ));
            };
            let text = url.get_ref();
            let scheme = text.split_once("://").map(|(s, _)| s);
            if !scheme.is_some_and(|s| schemes.contains(&s)) {
                return Err(at.err(
                    url,
                    "store.url",
                    format!(
                        "a {k} store's url starts with {}://",
                        schemes.join(":// or ")
                    ),
                ));
            }
            let url = text.clone();
            Ok(if k == "redis" {
                StoreConfig::Redis {
                    url,
                    prefix: raw.prefix.as_ref().map(|p| p.get_ref().clone()),
                }
            } else {
                StoreConfig::Mysql { url }
            })
        }
        Some(other) => Err(at.err(
            raw.kind.as_ref().expect("kind was given"),
            "store.kind",
            format!("`{other}` is not a store: {KINDS}"),
        )),
    }
}
