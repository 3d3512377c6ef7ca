//! `palisade namespace ...` and `palisade class ...`: create, update and list the
//! namespaces and lock classes kept in etcd.
//!
//! The API writes a namespace or class whole (`PUT`). `create` refuses one that exists
//! (exit 4); `update` reads the current one (exit 3 if there is none), changes only the
//! fields given, and writes it back. The read and the write are two calls: of two
//! admins updating one item at once, the last write wins.

use std::time::Duration;

use palisade_lock::{Enforcement, LockClass, Mode, Namespace, QuorumPolicy};
use serde_json::json;

use super::args::check_name;
use super::connect::Connection;
use super::exit::{CliError, Exit, Result};
use super::lock::{call, enc};

/// `palisade namespace` and the connection flags of its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct NamespaceArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: NamespaceCommand,
}

#[derive(Debug, clap::Subcommand)]
enum NamespaceCommand {
    /// List the namespaces the caller administers, as JSON.
    List,
    /// Create a namespace (service admins); exit 4 if it exists.
    Create {
        /// Namespace name, `[a-z0-9][a-z0-9_-]{0,62}`.
        ns: String,
        /// Owning tenant.
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        fields: NamespaceFields,
    },
    /// Change the fields given of an existing namespace (service admins); exit 3 if it
    /// does not exist.
    Update {
        /// Namespace name.
        ns: String,
        /// Owning tenant.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        fields: NamespaceFields,
    },
    /// Move a namespace to another etcd cluster tier (service admins): acquires in it
    /// answer 503 namespace-moving while its holds on the old tier drain, then it is
    /// served by the new tier under an epoch above every tier's; prints the move as
    /// JSON. A drain that times out rolls back; after any failure, run it again to
    /// resume or finish it.
    Rehome {
        /// Namespace name.
        ns: String,
        /// The tier to move it to.
        #[arg(long)]
        to: String,
        /// How long to wait for its holds and waiters on the old tier to end, in
        /// milliseconds (at most 600000).
        #[arg(long, default_value_t = 30_000)]
        drain_ms: u64,
    },
}

#[derive(Debug, clap::Args)]
struct NamespaceFields {
    /// Most holds and waits live at once in the namespace (default 10000).
    #[arg(long)]
    held_lease_quota: Option<u32>,
    /// Lock operations per second, per replica (default 1000).
    #[arg(long)]
    op_rate_quota: Option<u32>,
    /// The etcd cluster tier serving the namespace (default: the service's home tier).
    /// Set at create; an update cannot move a namespace (`namespace rehome` does).
    #[arg(long)]
    cluster_tier: Option<String>,
}

/// `palisade class` and the connection flags of its subcommands.
#[derive(Debug, clap::Args)]
pub(crate) struct ClassArgs {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: ClassCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ClassCommand {
    /// List a namespace's classes, as JSON (admins of the namespace).
    List {
        /// Namespace name.
        ns: String,
    },
    /// Create a class (admins of the namespace): exclusive, fenced, fail-closed, TTLs of
    /// 1 s to 60 s and no lock-delay unless told otherwise; exit 4 if it exists.
    Create {
        /// Namespace name.
        ns: String,
        /// Class name.
        class: String,
        /// Lock keys of the class start with this prefix. No class's prefix may start
        /// with another's in one namespace: the default, empty, covers every key and
        /// leaves no room for a second class.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        fields: ClassFields,
    },
    /// Change the fields given of an existing class; exit 3 if it does not exist.
    Update {
        /// Namespace name.
        ns: String,
        /// Class name.
        class: String,
        /// Lock keys of the class start with this prefix.
        #[arg(long)]
        prefix: Option<String>,
        #[command(flatten)]
        fields: ClassFields,
    },
}

#[derive(Debug, clap::Args)]
struct ClassFields {
    /// Shortest session TTL allowed to acquire, in milliseconds (at most 3600000).
    #[arg(long, value_parser = super::args::ttl_min_ms)]
    ttl_min_ms: Option<u64>,
    /// Longest session TTL allowed to acquire, in milliseconds (at most 3600000, the
    /// longest session TTL the service grants).
    #[arg(long, value_parser = super::args::ttl_max_ms)]
    ttl_max_ms: Option<u64>,
    /// `exclusive`: exclusive holds only; `shared`: shared and exclusive holds.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// `fenced`: resources refuse writes without a current token; `advisory`: they
    /// admit them and record them as unprotected.
    #[arg(long, value_enum)]
    enforcement: Option<EnforcementArg>,
    /// What acquire does when etcd cannot commit: `closed` fails, `open` grants
    /// without a token.
    #[arg(long, value_enum)]
    on_quorum_loss: Option<QuorumArg>,
    /// After a hold ends by expiry (its session's TTL lapsed, or the session was closed
    /// while it held) or force, no grant of its key for this long, in milliseconds (at
    /// most 3600000).
    #[arg(long, value_parser = super::args::lock_delay_ms)]
    lock_delay_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Exclusive,
    Shared,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum EnforcementArg {
    Fenced,
    Advisory,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum QuorumArg {
    Closed,
    Open,
}

impl NamespaceFields {
    fn apply(&self, n: &mut Namespace) {
        if let Some(q) = self.held_lease_quota {
            n.held_lease_quota = q;
        }
        if let Some(q) = self.op_rate_quota {
            n.op_rate_quota = q;
        }
        if let Some(t) = &self.cluster_tier {
            n.cluster_tier.clone_from(t);
        }
    }
}

impl ClassFields {
    fn apply(&self, c: &mut LockClass) {
        if let Some(v) = self.ttl_min_ms {
            c.ttl_min = Duration::from_millis(v);
        }
        if let Some(v) = self.ttl_max_ms {
            c.ttl_max = Duration::from_millis(v);
        }
        if let Some(v) = self.mode {
            c.mode = match v {
                ModeArg::Exclusive => Mode::Exclusive,
                ModeArg::Shared => Mode::Shared,
            };
        }
        if let Some(v) = self.enforcement {
            c.enforcement = match v {
                EnforcementArg::Fenced => Enforcement::Fenced,
                EnforcementArg::Advisory => Enforcement::Advisory,
            };
        }
        if let Some(v) = self.on_quorum_loss {
            c.on_quorum_loss = match v {
                QuorumArg::Closed => QuorumPolicy::Closed,
                QuorumArg::Open => QuorumPolicy::Open,
            };
        }
        if let Some(v) = self.lock_delay_ms {
            c.lock_delay = Duration::from_millis(v);
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The namespaces the caller sees.
fn namespaces(conn: &Connection) -> Result<Vec<Namespace>> {
    let client = conn.client()?;
    let v = conn.block_on("GET /v1/namespaces", async move {
        Ok(client.call_json("GET", "/v1/namespaces", None).await?)
    })?;
    Ok(serde_json::from_value(v)?)
}

/// The classes of `ns`.
fn classes(conn: &Connection, ns: &str) -> Result<Vec<LockClass>> {
    let client = conn.client()?;
    let path = format!("/v1/namespaces/{}/classes", enc(ns));
    let what = format!("GET {path}");
    let v = conn.block_on(&what, async move {
        Ok(client.call_json("GET", &path, None).await?)
    })?;
    Ok(serde_json::from_value(v)?)
}

/// `tier`: the `cluster_tier` to send (none: the service keeps the namespace's tier,
/// or picks its home tier for a new one).
fn put_namespace(conn: &Connection, n: &Namespace, tier: Option<&str>) -> Result<String> {
    let mut body = json!({ "tenant_id": n.tenant_id, "held_lease_quota": n.held_lease_quota,
                           "op_rate_quota": n.op_rate_quota });
    if let Some(t) = tier {
        body["cluster_tier"] = json!(t);
    }
    call(
        conn,
        "PUT",
        format!("/v1/namespaces/{}", enc(&n.id)),
        Some(body),
    )
}

fn put_class(conn: &Connection, c: &LockClass) -> Result<String> {
    call(
        conn,
        "PUT",
        format!("/v1/namespaces/{}/classes/{}", enc(&c.ns_id), enc(&c.id)),
        Some(
            json!({ "key_prefix": c.key_prefix, "ttl_min_ms": ms(c.ttl_min),
                     "ttl_max_ms": ms(c.ttl_max), "mode": c.mode, "enforcement": c.enforcement,
                     "on_quorum_loss": c.on_quorum_loss, "lock_delay_ms": ms(c.lock_delay) }),
        ),
    )
}

pub(crate) fn run_namespace(args: NamespaceArgs) -> Result<String> {
    let NamespaceArgs { conn, cmd } = args;
    match cmd {
        NamespaceCommand::List => call(&conn, "GET", "/v1/namespaces".into(), None),
        NamespaceCommand::Create { ns, tenant, fields } => {
            check_name("namespace", &ns)?;
            if namespaces(&conn)?.iter().any(|n| n.id == ns) {
                return Err(CliError::new(
                    Exit::Conflict,
                    format!("namespace {ns:?} exists: use `namespace update`"),
                )
                .into());
            }
            let mut n = Namespace::new(ns, tenant);
            fields.apply(&mut n);
            put_namespace(&conn, &n, fields.cluster_tier.as_deref())
        }
        NamespaceCommand::Update { ns, tenant, fields } => {
            check_name("namespace", &ns)?;
            let mut n = namespaces(&conn)?
                .into_iter()
                .find(|n| n.id == ns)
                .ok_or_else(|| {
                    CliError::new(
                        Exit::NotFound,
                        format!("no namespace {ns:?} (that you administer)"),
                    )
                })?;
            if let Some(t) = tenant {
                n.tenant_id = t;
            }
            fields.apply(&mut n);
            put_namespace(&conn, &n, fields.cluster_tier.as_deref())
        }
        NamespaceCommand::Rehome { ns, to, drain_ms } => {
            check_name("namespace", &ns)?;
            check_name("tier", &to)?;
            call(
                &conn,
                "POST",
                palisade_api::routes::rehome(&ns),
                Some(json!({ "to": to, "drain_ms": drain_ms })),
            )
        }
    }
}

pub(crate) fn run_class(args: ClassArgs) -> Result<String> {
    let ClassArgs { conn, cmd } = args;
    match cmd {
        ClassCommand::List { ns } => {
            check_name("namespace", &ns)?;
            call(
                &conn,
                "GET",
                format!("/v1/namespaces/{}/classes", enc(&ns)),
                None,
            )
        }
        ClassCommand::Create {
            ns,
            class,
            prefix,
            fields,
        } => {
            check_name("namespace", &ns)?;
            check_name("class", &class)?;
            let existing = classes(&conn, &ns)?;
            if existing.iter().any(|c| c.id == class) {
                return Err(CliError::new(
                    Exit::Conflict,
                    format!("class {ns}/{class} exists: use `class update`"),
                )
                .into());
            }
            if let Some(other) = existing.iter().find(|c| {
                c.key_prefix.starts_with(prefix.as_str()) || prefix.starts_with(&c.key_prefix)
            }) {
                return Err(CliError::bad_input(overlap(&ns, &class, &prefix, other)).into());
            }
            let mut c = LockClass::new(ns, class, prefix);
            fields.apply(&mut c);
            put_class(&conn, &c)
        }
        ClassCommand::Update {
            ns,
            class,
            prefix,
            fields,
        } => {
            check_name("namespace", &ns)?;
            check_name("class", &class)?;
            let mut c = classes(&conn, &ns)?
                .into_iter()
                .find(|c| c.id == class)
                .ok_or_else(|| CliError::new(Exit::NotFound, format!("no class {ns}/{class}")))?;
            if let Some(p) = prefix {
                c.key_prefix = p;
            }
            fields.apply(&mut c);
            put_class(&conn, &c)
        }
    }
}

/// What to do when the prefix of a new class overlaps that of `other`.
fn overlap(ns: &str, class: &str, prefix: &str, other: &LockClass) -> String {
    let (id, theirs) = (&other.id, &other.key_prefix);
    if theirs.is_empty() {
        format!(
            "class {ns}/{id} has the empty key prefix, which covers every key of {ns}, so no \
             other class fits beside it: give it a prefix first (`palisade class update {ns} \
             {id} --prefix {id}-`), then create {class} with a --prefix of its own"
        )
    } else if prefix.is_empty() {
        format!(
            "with no --prefix (or an empty one), class {class} would take the empty key \
             prefix, which covers every key, and {ns} already has class {id} (prefix \
             {theirs:?}): pass a --prefix that neither starts with {theirs:?} nor is the start \
             of it, e.g. --prefix {class}-"
        )
    } else {
        format!(
            "--prefix {prefix:?} overlaps class {ns}/{id}'s prefix {theirs:?} (one starts with \
             the other): pass a --prefix that neither starts with {theirs:?} nor is the start of it"
        )
    }
}
