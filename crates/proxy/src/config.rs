//! The proxy's configuration: a TOML file, or the flags of the one-upstream case.
//!
//! ```toml
//! listen = "127.0.0.1:8080"            # where clients connect (HTTP/1.1 and h2c)
//! upstream = "http://127.0.0.1:9000"   # the service behind the proxy (http://)
//! admin = "127.0.0.1:9464"             # optional: /livez, /readyz, /metrics
//!
//! [store]                              # where the high-water marks live
//! kind = "postgres"                    # memory (default) | postgres | redis | mysql
//! database = "host=db user=fence dbname=orders"   # redis, mysql: url = "redis://…"
//!
//! [default]                            # every path no route matches
//! policy = "open"                      # fenced (default) | advisory | open
//!
//! [[route]]
//! path = "/orders/{id}"
//! methods = ["PUT", "DELETE"]          # default: POST, PUT, PATCH, DELETE
//! resource = "orders/{id}"             # default: the decoded path
//! policy = "fenced"
//! ```
//!
//! Also `[timeouts]` (milliseconds: `connect_ms`, `header_ms`, `body_stall_ms`,
//! `upstream_ms`, `drain_ms`, see [`Timeouts`]), `[audit]` (`database`, `spool`,
//! `service`: refused and unprotected writes go to the audit trail; `spool` is a file), `max_connections`,
//! and `http2 = false` to serve HTTP/1.1 only. Unknown keys are errors.
//!
//! Every error names the file, the line, the field and the cause ([`ConfigError`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, Uri};
use serde::Deserialize;
use toml::Spanned;

use crate::route::{PathPattern, Policy, ResourceTemplate, Route, RouteTable, DEFAULT_METHODS};
use store::RawStore;

/// A config that cannot be used: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {cause}")]
pub struct ConfigError {
    /// The file (or `command line` for flags).
    pub file: String,
    /// The line, from 1 (0: the file as a whole).
    pub line: usize,
    /// The field, dotted (`route[2].policy`), or `-` when the file cannot be read.
    pub field: String,
    /// What is wrong.
    pub cause: String,
}

/// Where the high-water marks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// In this process ([`palisade_fence::MemoryStore`]): one replica only; marks are
    /// lost on restart.
    Memory {
        /// How many resources' marks are kept before the oldest are forgotten.
        capacity: u64,
    },
    /// In PostgreSQL ([`palisade_fence::PostgresStore`]): shared by replicas, durable,
    /// safe behind PgBouncer in transaction mode.
    Postgres {
        /// A libpq connection string.
        database: String,
    },
    /// In Redis ([`palisade_fence::RedisStore`], the `palisade_fence` function library):
    /// shared by replicas; durable as the server is configured (docs/resources.md).
    Redis {
        /// `redis://[user:password@]host:port[/db]`.
        url: String,
        /// The key prefix of the marks ([`palisade_fence::redis::KeyLayout`]); `None`:
        /// its default, `palisade:fence:`.
        prefix: Option<String>,
    },
    /// In MySQL or MariaDB ([`palisade_fence::MysqlStore`], InnoDB): shared by replicas,
    /// durable.
    Mysql {
        /// `mysql://user[:password]@host:port/database`.
        url: String,
    },
}

/// The audit trail refused and unprotected writes go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The audit database (libpq connection string).
    pub database: String,
    /// The spool file for events the database cannot take at once (created with its
    /// directory when first needed).
    pub spool: PathBuf,
    /// The service name the events carry.
    pub service: String,
}

/// The proxy's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to the upstream; past it, 502. Default 2 s.
    pub connect: Duration,
    /// A client's request head, and an idle keep-alive connection (slowloris); past it
    /// the connection is closed. Default 10 s.
    pub header: Duration,
    /// A request body that delivers nothing, or a response the client reads nothing of.
    /// Default 30 s.
    pub body_stall: Duration,
    /// The upstream's response head, counted while the request body is not arriving;
    /// past it, 504. Default 30 s.
    pub upstream: Duration,
    /// On SIGTERM, how long requests in flight may take. Default 30 s.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            header: Duration::from_secs(10),
            body_stall: Duration::from_secs(30),
            upstream: Duration::from_secs(30),
            drain: Duration::from_secs(30),
        }
    }
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The upstream's base (`http://host:port`, no path).
    pub upstream: Uri,
    /// Where `/livez`, `/readyz` and `/metrics` are served, if anywhere.
    pub admin: Option<SocketAddr>,
    /// Where marks live.
    pub store: StoreConfig,
    /// Where refused and unprotected writes are recorded, if anywhere.
    pub audit: Option<AuditConfig>,
    /// The bounds.
    pub timeouts: Timeouts,
    /// The routes, the default last.
    pub routes: RouteTable,
    /// Whether h2 is served next to HTTP/1.1.
    pub http2: bool,
    /// Connections served at once.
    pub max_connections: usize,
}

/// The default memory store capacity: 100,000 resources.
pub const DEFAULT_CAPACITY: u64 = 100_000;
/// The default connection cap: 1,024.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Spanned<String>,
    upstream: Spanned<String>,
    admin: Option<Spanned<String>>,
    http2: Option<bool>,
    max_connections: Option<Spanned<u64>>,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    timeouts: RawTimeouts,
    audit: Option<RawAudit>,
    #[serde(default)]
    default: RawDefault,
    #[serde(default, rename = "route")]
    routes: Vec<RawRoute>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect_ms: Option<Spanned<u64>>,
    header_ms: Option<Spanned<u64>>,
    body_stall_ms: Option<Spanned<u64>>,
    upstream_ms: Option<Spanned<u64>>,
    drain_ms: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAudit {
    database: Spanned<String>,
    spool: Spanned<String>,
    service: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefault {
    policy: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: Spanned<String>,
    methods: Option<Spanned<Vec<String>>>,
    resource: Option<Spanned<String>>,
    policy: Spanned<String>,
}

/// Builds errors against one file's text.
struct At<'a> {
    file: &'a str,
    text: &'a str,
}

impl At<'_> {
    fn line(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    fn err<T>(&self, spanned: &Spanned<T>, field: &str, cause: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: self.line(spanned.span().start),
            field: field.to_owned(),
            cause: cause.into(),
        }
    }

    /// A TOML or shape error: the line of its span, and the key on that line under the
    /// table it is in.
    fn toml(&self, e: &toml::de::Error) -> ConfigError {
        let start = e.span().map_or(0, |s| s.start);
        let line = self.line(start);
        ConfigError {
            file: self.file.to_owned(),
            line,
            field: self.field_at(line),
            cause: e.message().trim().to_owned(),
        }
    }

    /// `table.key` for the key assigned on `line` (1-based), `-` when there is none.
    fn field_at(&self, line: usize) -> String {
        let lines: Vec<&str> = self.text.lines().collect();
        let Some(here) = lines.get(line.saturating_sub(1)) else {
            return "-".into();
        };
        let key = here
            .split_once('=')
            .map(|(k, _)| k.trim().trim_matches('"'));
        let mut table = None;
        let mut routes = 0usize;
        for l in &lines[..line.saturating_sub(1)] {
            let t = l.trim();
            if t == "[[route]]" {
                routes += 1;
                table = Some(format!("route[{}]", routes - 1));
            } else if let Some(name) = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
                table = Some(name.trim().to_owned());
            }
        }
        let header = here.trim();
        match (table, key) {
            (_, None) if header.starts_with('[') => header.to_owned(),
            (Some(t), Some(k)) => format!("{t}.{k}"),
            (None, Some(k)) => k.to_owned(),
            (Some(t), None) => t,
            (None, None) => "-".into(),
        }
    }
}

impl ProxyConfig {
    /// Reads and checks the config file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: the file cannot be read, is not TOML, has an unknown key or a
    /// value of the wrong type, or a value that cannot be used (an address, the
    /// upstream, a policy, a method, a pattern, a template, a store without its
    /// database).
    pub fn load(path: &Path) -> Result<ProxyConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            field: "-".into(),
            cause: format!("cannot be read: {e}"),
        })?;
        ProxyConfig::parse(&file, &text)
    }

    /// Checks config `text`; `file` names it in errors.
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load), but for reading.
    pub fn parse(file: &str, text: &str) -> Result<ProxyConfig, ConfigError> {
        let at = At { file, text };
        let raw: RawConfig = toml::from_str(text).map_err(|e| at.toml(&e))?;
        let listen = address(&at, &raw.listen, "listen")?;
        let admin = raw
            .admin
            .as_ref()
            .map(|a| address(&at, a, "admin"))
            .transpose()?;
        let upstream = upstream(&raw.upstream.get_ref()[..])
            .map_err(|cause| at.err(&raw.upstream, "upstream", cause))?;
        let store = store::parse(&at, &raw.store)?;
        let mut timeouts = Timeouts::default();
        for (value, field, slot) in [
            (
                &raw.timeouts.connect_ms,
                "timeouts.connect_ms",
                &mut timeouts.connect,
            ),
            (
                &raw.timeouts.header_ms,
                "timeouts.header_ms",
                &mut timeouts.header,
            ),
            (
                &raw.timeouts.body_stall_ms,
                "timeouts.body_stall_ms",
                &mut timeouts.body_stall,
            ),
            (
                &raw.timeouts.upstream_ms,
                "timeouts.upstream_ms",
                &mut timeouts.upstream,
            ),
            (
                &raw.timeouts.drain_ms,
                "timeouts.drain_ms",
                &mut timeouts.drain,
            ),
        ] {
            if let Some(v) = value {
                if *v.get_ref() == 0 {
                    return Err(at.err(v, field, "must be at least 1 (milliseconds)"));
                }
                *slot = Duration::from_millis(*v.get_ref());
            }
        }
        let default = match &raw.default.policy {
            None => Policy::Fenced,
            Some(p) => policy(&at, p, "default.policy")?,
        };
        let mut routes = Vec::with_capacity(raw.routes.len());
        for (i, r) in raw.routes.iter().enumerate() {
            let field = |f: &str| format!("route[{i}].{f}");
            let pattern = PathPattern::parse(r.path.get_ref())
                .map_err(|e| at.err(&r.path, &field("path"), e.to_string()))?;
            let resource = r
                .resource
                .as_ref()
                .map(|t| {
                    ResourceTemplate::parse(t.get_ref(), &pattern)
                        .map_err(|e| at.err(t, &field("resource"), e.to_string()))
                })
                .transpose()?;
            let methods = match &r.methods {
                None => DEFAULT_METHODS.to_vec(),
                Some(m) => {
                    if m.get_ref().is_empty() {
                        return Err(at.err(
                            m,
                            &field("methods"),
                            "is empty: leave it out for POST, PUT, PATCH, DELETE",
                        ));
                    }
                    m.get_ref()
                        .iter()
                        .map(|name| {
                            let upper = name.to_ascii_uppercase();
                            Method::from_bytes(upper.as_bytes())
                                .ok()
                                .filter(|_| {
                                    !upper.is_empty()
                                        && upper.bytes().all(|b| b.is_ascii_uppercase())
                                })
                                .ok_or_else(|| {
                                    at.err(
                                        m,
                                        &field("methods"),
                                        format!("`{name}` is not an HTTP method"),
                                    )
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()?
                }
            };
            routes.push(Route {
                pattern: Some(pattern),
                methods,
                resource,
                policy: policy(&at, &r.policy, &field("policy"))?,
            });
        }
        let audit = match raw.audit {
            None => None,
            Some(a) => {
                a.database
                    .get_ref()
                    .parse::<tokio_postgres::Config>()
                    .map_err(|e| {
                        at.err(
                            &a.database,
                            "audit.database",
                            format!("not a libpq connection string: {e}"),
                        )
                    })?;
                let spool = PathBuf::from(a.spool.get_ref());
                if spool.is_dir() {
                    return Err(at.err(
                        &a.spool,
                        "audit.spool",
                        format!(
                            "{} is a directory; name the spool file in it",
                            spool.display()
                        ),
                    ));
                }
                Some(AuditConfig {
                    database: a.database.into_inner(),
                    spool,
                    service: a.service.unwrap_or_else(|| "palisade-proxy".into()),
                })
            }
        };
        let max_connections = match &raw.max_connections {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(m) if *m.get_ref() == 0 => {
                return Err(at.err(m, "max_connections", "must be at least 1"))
            }
            Some(m) => usize::try_from(*m.get_ref()).unwrap_or(usize::MAX),
        };
        Ok(ProxyConfig {
            listen,
            upstream,
            admin,
            store,
            audit,
            timeouts,
            routes: RouteTable::new(routes, default),
            http2: raw.http2.unwrap_or(true),
            max_connections,
        })
    }

    /// The one-upstream config of the flags: every path under `policy`, the resource
    /// the decoded path, the write methods checked.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] (file `command line`) naming the flag at fault.
    pub fn from_flags(
        listen: &str,
        upstream_url: &str,
        policy_name: &str,
        store: StoreConfig,
    ) -> Result<ProxyConfig, ConfigError> {
        let flag = |field: &str, cause: String| ConfigError {
            file: "command line".into(),
            line: 0,
            field: field.into(),
            cause,
        };
        let listen = listen
            .parse()
            .map_err(|_| flag("--listen", format!("`{listen}` is not an IP:PORT address")))?;
        let upstream = upstream(upstream_url).map_err(|c| flag("--upstream", c))?;
        let policy = Policy::parse(policy_name).ok_or_else(|| {
            flag(
                "--policy",
                format!("`{policy_name}` is not a policy: fenced, advisory or open"),
            )
        })?;
        Ok(ProxyConfig {
            listen,
            upstream,
            admin: None,
            store,
            audit: None,
            timeouts: Timeouts::default(),
            routes: RouteTable::new(Vec::new(), policy),
            http2: true,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        })
    }
}

fn address(at: &At<'_>, value: &Spanned<String>, field: &str) -> Result<SocketAddr, ConfigError> {
    value.get_ref().parse().map_err(|_| {
        at.err(
            value,
            field,
            format!("`{}` is not an IP:PORT address", value.get_ref()),
        )
    })
}

fn policy(at: &At<'_>, value: &Spanned<String>, field: &str) -> Result<Policy, ConfigError> {
    Policy::parse(value.get_ref()).ok_or_else(|| {
        at.err(
            value,
            field,
            format!(
                "`{}` is not a policy: fenced, advisory or open",
                value.get_ref()
            ),
        )
    })
}

/// `http://host:port` with no path, query or user info.
fn upstream(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "`{text}`: the upstream is reached over http:// (put the proxy beside it)"
        ));
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("`{text}` names no host"));
    };
    if authority.as_str().contains('@') {
        return Err(format!("`{text}`: user info is not allowed"));
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err(format!(
            "`{text}` has a path; the upstream is a base URL, requests keep their own path"
        ));
    }
    Ok(uri)
}

mod store;
#[cfg(test)]
mod tests;
