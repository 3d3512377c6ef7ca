//! `palisade fence ...`: read a resource's high-water mark in its store (Postgres, Redis or
//! MySQL/MariaDB; see [`super::mark_store`]), and lower one that a mistaken token
//! poisoned.
//!
//! `show` reads the mark and the resource's last resets from the store's reset log.
//! `reset` calls the store's `fence_reset` (it only lowers, to a token you name, needs a
//! reason, and logs itself in the store with the identity the store authenticated) and
//! then records the reset in the audit trail, which must exist already, with that
//! identity as the actor. It never lowers a mark below the newest grant of the lock that guards the
//! resource: with `--lock NS/CLASS/KEY` it reads the lock from etcd (`--etcd`) at one
//! revision, and the floor is the newest holder's token or, with no holder,
//! `epoch · 2^48 + that revision` (above every grant made so far); `--lock-unknown` skips
//! the check and both records say so. Exit codes: 2 for a refused reset (a reason that is
//! empty, blank, over 1024 bytes or holds a control character; a token not below the
//! mark, or below the lock's floor; a malformed lock name; an audit database without an
//! audit trail), 3 when the resource has no mark.

use palisade_fence::{Epoch, FencingToken, MarkReset, ResetGuard, Revision};

use super::etcd::{self, EtcdTarget, EtcdTlsArgs};
use super::exit::{CliError, Exit, Result};
use super::mark_store::{MarkStore, StoreTarget};

/// `palisade fence`.
#[derive(Debug, clap::Args)]
pub(crate) struct FenceArgs {
    /// The resource's database (where `fence_high_water` is): a libpq connection string,
    /// key/value or URL form. Needed by `show` and `reset`; for `proxy`, its store.
    #[arg(long, env = "PALISADE_FENCE_DATABASE")]
    database: Option<String>,
    /// The resource's store, for `show` and `reset`, as a URL whose scheme names it:
    /// `postgres://…` (as --database), `redis://…`, or
    /// `mysql://…` (MySQL or MariaDB).
    #[arg(
        long,
        env = "PALISADE_FENCE_STORE",
        value_name = "URL",
        conflicts_with = "database"
    )]
    store: Option<String>,
    /// The key prefix of the marks in a Redis store (as the store's writers use it).
    #[arg(long, value_name = "PREFIX", default_value = palisade_fence::redis::KeyLayout::DEFAULT_PREFIX)]
    redis_prefix: String,
    #[command(subcommand)]
    cmd: FenceCommand,
}

// Parsed once per process and matched at once: the size of the larger variant costs
// nothing that boxing would save.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
enum FenceCommand {
    /// A fencing reverse proxy in front of an HTTP service: writes on fenced routes
    /// need a current Fencing-Token; see docs/proxy.md.
    Proxy(super::proxy::ProxyArgs),
    #[command(flatten)]
    Marks(MarkCommand),
}

/// The commands on the resource's database.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
enum MarkCommand {
    /// Print RESOURCE's mark (token, epoch, revision, last change) and its last resets.
    Show {
        /// The resource key, as the fence layer or the SQL helper names it.
        resource: String,
        /// How many of the last resets to print.
        #[arg(long, default_value_t = 5)]
        resets: i64,
    },
    /// Lower RESOURCE's mark to --to, for --reason; recorded in the resource's database
    /// and in the audit trail, with the database role that ran it as the actor. --to may
    /// not be below the newest grant of the lock that guards RESOURCE (--lock, read from
    /// --etcd): a lower mark would admit that lock's earlier holders again. Without a
    /// known lock, say so with --lock-unknown.
    Reset {
        /// The resource key.
        resource: String,
        /// The new mark: a decimal token below the current mark, and at or above the
        /// lock's newest grant.
        #[arg(long)]
        to: String,
        /// Why (kept in both records): 1 to 1024 bytes, not blank, no control character.
        #[arg(long)]
        reason: String,
        /// The audit database, where the reset is recorded.
        #[arg(long, env = "PALISADE_AUDIT_DATABASE")]
        audit_database: String,
        #[command(flatten)]
        guard: GuardArgs,
        /// etcd client endpoint of the cluster serving the lock's namespace (its tier), for
        /// --lock (`http://host:port`, or `https://host:port` with --etcd-ca); repeat for
        /// several members. Read only.
        #[arg(long = "etcd")]
        etcd: Vec<String>,
        #[command(flatten)]
        etcd_tls: EtcdTlsArgs,
        /// The root prefix of the lock key space (with --lock).
        #[arg(long, default_value = "/palisade/")]
        root: String,
    },
}

/// How a reset learns how low it may go: the lock that guards the resource, or the
/// operator's word that none is known.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct GuardArgs {
    /// The lock that guards RESOURCE, NAMESPACE/CLASS/KEY: its newest grant, read from
    /// --etcd, is the lowest --to allowed.
    #[arg(long, value_name = "NAMESPACE/CLASS/KEY", requires = "etcd")]
    lock: Option<String>,
    /// No lock is known to guard RESOURCE: reset without that check, recorded as such in
    /// both records. Every holder of a token at or above --to is admitted again.
    #[arg(long)]
    lock_unknown: bool,
}

pub(crate) fn run(args: FenceArgs) -> Result<String> {
    match args.cmd {
        FenceCommand::Proxy(proxy) => super::proxy::run(proxy, args.database),
        FenceCommand::Marks(cmd) => run_marks(cmd, args.database, args.store, args.redis_prefix),
    }
}

fn run_marks(
    cmd: MarkCommand,
    database: Option<String>,
    store: Option<String>,
    redis_prefix: String,
) -> Result<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let resource = match &cmd {
        MarkCommand::Show { resource, .. } | MarkCommand::Reset { resource, .. } => resource,
    };
    let target = StoreTarget::parse(database.as_deref(), store.as_deref(), redis_prefix)?;
    if resource.is_empty() {
        return Err(CliError::bad_input("RESOURCE is empty: name the resource key").into());
    }
    runtime.block_on(async move {
        let mut marks = MarkStore::open(target).await?;
        match cmd {
            MarkCommand::Show { resource, resets } => show(&mut marks, &resource, resets).await,
            MarkCommand::Reset {
                resource,
                to,
                reason,
                audit_database,
                guard,
                etcd: endpoints,
                etcd_tls,
                root,
            } => {
                let to: FencingToken = to
                    .parse()
                    .map_err(|e| CliError::bad_input(format!("--to {to:?}: {e}")))?;
                palisade_api::validate_text("--reason", &reason, palisade_api::MAX_REASON_LEN)
                    .map_err(|e| CliError::bad_input(e.to_string()))?;
                // The lock's floor, before anything changes: a --to below the newest grant
                // would admit that lock's earlier holders again.
                let guard = match guard.lock {
                    Some(spec) => {
                        let lock = parse_lock(&spec)?;
                        let target = etcd::home(&endpoints, &etcd_tls)?;
                        let floor = lock_floor(&target, &root, &lock).await?;
                        if to < floor.token {
                            return Err(CliError::bad_input(format!(
                                "--to {to} is below {}, {}; a lower mark would admit the \
                                 lock's earlier holders again",
                                floor.token,
                                floor.describe(&spec)
                            ))
                            .into());
                        }
                        ResetGuard::lock(spec, floor.token)
                    }
                    None => ResetGuard::LockUnknown,
                };
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
                let old = marks.reset(&resource, to, &reason, &guard).await?;
                let unrecorded = |e: &dyn std::fmt::Display| {
                    CliError::new(
                        Exit::Failure,
                        format!(
                            "{resource}: mark reset from {old} to {to} (logged in the store's \
                             reset log), but not recorded in the audit trail: {e}"
                        ),
                    )
                };
                // The actor is who the store logged the reset as: the identity the store
                // authenticated (no name the caller types).
                let actor = marks.actor().await.map_err(|e| unrecorded(&e))?;
                let mut record =
                    palisade_audit::FenceReset::new(&resource, old, to, &reason, actor);
                if let ResetGuard::Lock { name, floor } = &guard {
                    record = record.with_lock(name.clone(), *floor);
                }
                palisade_audit::insert_fence_reset(&**audit, &record)
                    .await
                    .map_err(|e| unrecorded(&super::exit::with_causes(&e)))?;
                let checked = match &guard {
                    ResetGuard::Lock { name, floor } => {
                        format!("checked against lock {name}: not below {floor}")
                    }
                    _ => "lock unknown: not checked against a lock's grants".to_owned(),
                };
                Ok(format!(
                    "{resource}: mark reset from {old} to {to} ({checked})\n\
                     recorded in the audit trail as {} by {}",
                    record.id, record.actor
                ))
            }
        }
    })
}

async fn show(marks: &mut MarkStore, resource: &str, resets: i64) -> Result<String> {
    let Some(mark) = marks.mark(resource).await? else {
        return Err(CliError::new(Exit::NotFound, format!("{resource} has no mark")).into());
    };
    let mut out = format!(
        "resource {resource}\nmark {} (epoch {}, revision {})\nupdated {}",
        mark.token,
        mark.token.epoch(),
        mark.token.revision(),
        humantime::format_rfc3339_seconds(mark.updated_at)
    );
    for MarkReset {
        old,
        new,
        reason,
        reset_by,
        reset_at,
        lock,
        ..
    } in marks.resets(resource, resets).await?
    {
        let lock = match lock {
            Some((name, floor)) => format!("lock {}, floor {floor}", one_line(&name)),
            None => "lock unknown".to_owned(),
        };
        out.push_str(&format!(
            "\nreset {} by {}: {old} -> {new} ({}) [{lock}]",
            humantime::format_rfc3339_seconds(reset_at),
            one_line(&reset_by),
            one_line(&reason),
        ));
    }
    Ok(out)
}

/// The lowest mark a reset may set for a resource guarded by a lock, read from etcd at
/// one revision.
#[derive(Debug)]
struct Floor {
    /// The newest current holder's token; with no holder, `epoch · 2^48 + revision`,
    /// which no earlier grant's token reaches (every grant's revision is at most the
    /// revision read, its epoch at most the current one).
    token: FencingToken,
    /// How many hold the lock now.
    holders: usize,
    /// The etcd revision read at.
    revision: i64,
}

impl Floor {
    /// What the floor is, for a refusal: whose token, read at which revision.
    fn describe(&self, lock: &str) -> String {
        if self.holders == 0 {
            format!(
                "the lowest token lock {lock} can grant next (no holder; etcd revision {})",
                self.revision
            )
        } else {
            format!(
                "the newest grant of lock {lock} ({} holding; etcd revision {})",
                self.holders, self.revision
            )
        }
    }
}

/// `NAMESPACE/CLASS/KEY`, each part checked by the service's rules.
fn parse_lock(spec: &str) -> Result<(String, String, String)> {
    let mut parts = spec.splitn(3, '/');
    let (Some(ns), Some(class), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(CliError::bad_input(format!(
            "--lock {spec:?}: name the lock as NAMESPACE/CLASS/KEY"
        ))
        .into());
    };
    let bad = |e: &dyn std::fmt::Display| CliError::bad_input(format!("--lock {spec:?}: {e}"));
    palisade_api::validate_name(ns).map_err(|e| bad(&e))?;
    palisade_api::validate_name(class).map_err(|e| bad(&e))?;
    palisade_api::validate_key(key).map_err(|e| bad(&e))?;
    Ok((ns.to_owned(), class.to_owned(), key.to_owned()))
}

/// How long each etcd call of `fence reset --lock` may take.
const ETCD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads `lock`'s holds and the epoch record in one Txn (one revision).
async fn lock_floor(
    target: &EtcdTarget,
    root: &str,
    (ns, class, key): &(String, String, String),
) -> Result<Floor> {
    let unreachable = |e: &dyn std::error::Error| {
        CliError::new(
            Exit::Failure,
            format!("etcd {}: {}", target.joined(), super::exit::with_causes(e)),
        )
    };
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(ETCD_TIMEOUT)
        .with_timeout(ETCD_TIMEOUT);
    if let Some(tls) = &target.tls {
        options = tls.apply(options);
    }
    let mut client = etcd_client::Client::connect(&target.endpoints, Some(options))
        .await
        .map_err(|e| unreachable(&e))?;
    let keys = palisade_api::keys::RootKeys::new(root);
    let lock = keys.lock(ns, class, key);
    let txn = etcd_client::Txn::new().and_then([
        etcd_client::TxnOp::get(
            lock.holds(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ),
        etcd_client::TxnOp::get(keys.epoch(), None),
    ]);
    let resp = tokio::time::timeout(ETCD_TIMEOUT, client.txn(txn))
        .await
        .map_err(|_| {
            CliError::new(
                Exit::Failure,
                format!(
                    "etcd {}: no answer within {ETCD_TIMEOUT:?}",
                    target.joined()
                ),
            )
        })?
        .map_err(|e| unreachable(&e))?;
    let revision = resp
        .header()
        .map_or(0, etcd_client::ResponseHeader::revision);
    let mut ranges = resp.op_responses().into_iter().map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().to_vec(),
        _ => Vec::new(),
    });
    let (holds, epoch) = (
        ranges.next().unwrap_or_default(),
        ranges.next().unwrap_or_default(),
    );
    let corrupt = |what: String| CliError::new(Exit::Failure, what);
    let mut newest: Option<FencingToken> = None;
    let mut holders = 0;
    for kv in holds
        .iter()
        .filter(|kv| lock.in_lease_ranges(kv.key()) && lock.is_lease_key(kv.key()))
    {
        let value = palisade_api::keys::HoldValue::parse(kv.value()).ok_or_else(|| {
            corrupt(format!(
                "the hold {} does not parse: cannot tell the lock's newest grant",
                String::from_utf8_lossy(kv.key())
            ))
        })?;
        let token = Epoch::new(value.epoch)
            .ok()
            .zip(Revision::from_i64(kv.create_revision()).ok())
            .and_then(|(e, r)| FencingToken::from_parts(e, r).ok())
            .ok_or_else(|| {
                corrupt(format!(
                    "the hold {} has no valid token",
                    String::from_utf8_lossy(kv.key())
                ))
            })?;
        holders += 1;
        newest = newest.max(Some(token));
    }
    let token = match newest {
        Some(token) => token,
        None => {
            // No holder: the next grant's token is above epoch · 2^48 + this revision.
            let epoch = match epoch.first() {
                Some(kv) => {
                    serde_json::from_slice::<palisade_api::EpochRecord>(kv.value())
                        .map_err(|e| {
                            corrupt(format!("the epoch record in etcd does not parse: {e}"))
                        })?
                        .epoch
                }
                None => Epoch::new(0).map_err(|e| corrupt(e.to_string()))?,
            };
            Revision::from_i64(revision)
                .ok()
                .and_then(|r| FencingToken::from_parts(epoch, r).ok())
                .ok_or_else(|| corrupt(format!("etcd revision {revision} makes no token")))?
        }
    };
    Ok(Floor {
        token,
        holders,
        revision,
    })
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
