//! The lock-event tailer: etcd history of the lock key space becomes `audit_event` rows,
//! and epoch records and rehome switches become `epoch_event` and `rehome_event` rows.
//!
//! The tailer watches `<root>` with `prev_kv`, from the revision after the one it last
//! stored for the cluster, and reads each revision's events together (etcd never splits
//! one revision over two watch responses). What the lock core writes in one revision of
//! `<root>locks/` tells the lock events apart (see the lock core's "Key layout"):
//!
//! | in one revision | row |
//! |---|---|
//! | `h/<m>/<lease>` created | `grant`, token `epoch · 2^48 + create_revision` |
//! | `h/<m>/<lease>` and `g/<m>/<lease>` deleted | `release` |
//! | `h/<m>/<lease>` deleted, `g/<m>/<lease>` put as `{"forced": …}` | `force` |
//! | `h/<m>/<lease>` deleted with the lease's marker (`leases/<lease>` or `sessions/<lease>`) | `expire` |
//! | `h/<m>/<lease>` of a hold without a grant record deleted alone | `release` |
//! | `h/<m>/<lease>` of a hold with a grant record deleted, the record untouched | `expire` |
//!
//! The rule is `palisade_api::keys::HoldEnd::classify`, which the chaos checker applies
//! too; the deletes of lease markers outside `<root>locks/` in the same watch response
//! tell which leases ended in which revision. A release that hands the lock over to the oldest waiter (the lock core's
//! hand-over at release) deletes one lease's hold and creates another's in one
//! revision: a `release` and a `grant` row, in etcd's order (the release first).
//!
//! Spiffe ID and token of a release, expiry or force come from the deleted hold's value
//! (`prev_kv`). Every other key (waiters, grant records on their own, per-attempt
//! markers under `c/`, anything not in the layout) yields no row.
//!
//! Outside `<root>locks/`, two keys yield rows (see [`EpochAdvance`](crate::EpochAdvance)
//! and [`RehomeSwitch`](crate::RehomeSwitch)): each put of `<root>config/epoch` is an
//! `epoch_event` row (the record's epoch, reason, cluster id, start time and revision),
//! and each put of `<root>tier/rehome/<ns>` in phase `switched` (written on the home tier
//! at a rehome's commit point) a `rehome_event` row naming the namespace, both tiers and
//! the new epoch. A rehome's advance is written on the new tier, its switch on the home
//! tier: the rows join by epoch. Every other key yields nothing.
//!
//! Rows and the position (`audit_cursor`) are written in one transaction per watch
//! response, and rows are keyed `(cluster_id, revision, seq)`: a crash anywhere loses
//! nothing and stores nothing twice. When etcd compacted past the position, the tailer
//! records a `gap` row for the revisions it can no longer read, the compaction revision
//! included (compaction drops that revision's deletions, so it can only be read in part),
//! and goes on after it (the position moves only with lock-key events, so a gap can also
//! span revisions that held none, and a response with epoch rows only is read again after
//! a restart: its rows are keyed by `(cluster_id, revision)`, so they are stored once). Any failure (etcd or Postgres) ends the watch; the
//! tailer backs off and starts again from the stored position, so a database outage only
//! makes it fall behind. It never writes to etcd.
//!
//! # Restored clusters
//!
//! etcd restored from a snapshot under a new cluster id serves the snapshot's history
//! again, up to the snapshot's revision, and the tailer, having no position for the new
//! id, reads it from the start. So that those grants and releases are not stored a second
//! time, the tailer keeps, for every revision that changed the lock key space, a SHA-256
//! digest of that revision's changes (kind, key, value, create and mod revision, version
//! and lease of each, in etcd's order) in `audit_history`, in the same transaction as the
//! revision's rows. Reading a cluster, it compares each revision with the audited
//! clusters' digests; revision `r` *repeats* cluster `A` when every revision with
//! lock-key changes the new cluster showed from where reading began (its first revision,
//! or the revision after a compaction) through `r` has the same digest in `A`, `A` has no
//! other revision with changes in that range, and `A` was read past `r`. Such a revision's
//! events are `A`'s, stored under `A` already, and are not stored again. The first
//! revision that repeats no audited cluster ends the repeat for good
//! (`audit_cursor.repeats` becomes empty): everything after it is the new cluster's own
//! history, stored under its id, even at revision numbers another cluster used for other
//! events. Identical history means identical events (same revisions, keys, tokens and
//! holders), and one different revision, even of a key that yields no event, means the
//! histories diverged, which is why every change is digested, not only the events.
//! Digests cover the lock key space only. An epoch record a restored cluster serves again
//! names its source cluster: `epoch_event` keeps one row per record (the record's cluster
//! id and epoch are unique), and `rehome_event` one per `(namespace, epoch)`.
//!
//! Limits: history audited before schema version 4 has no digests, so a restore of it is
//! stored again; a cluster is compared with what was audited when it is read, so tail the
//! old cluster to its end before the restored one (history the old cluster's tailer never
//! read is stored under the new id, once).
//!
//! Known limit: after a restore of etcd from an older snapshot with the same cluster id,
//! the tailer waits until etcd's revision passes its position; revisions reused by the
//! restored cluster in between are not audited (advance the lock epoch on every restore).

use std::convert::Infallible;
use std::time::Duration;

use deadpool_postgres::Pool;
use etcd_client::{Client, ConnectOptions, GetOptions, TlsOptions, WatchOptions};
use palisade_api::keys::RootKeys;
use palisade_api::limits::ETCD_KEEPALIVE_INTERVAL;
use palisade_fence::Revision;
use tokio_postgres::GenericClient;

use crate::{
    insert_epoch_advances, insert_lock_events, insert_rehome_switches, restored, AuditError,
    ClusterId, LockEvent,
};
pub(crate) use classify::{classify, lease_ends, Change};
use epochs::EpochChanges;

/// How long one database step (taking a connection, or one batch's transaction) may take
/// before it counts as the database being unavailable.
const DB_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one etcd request (not the watch itself) may take.
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);

const UPSERT_CURSOR: &str = "INSERT INTO audit_cursor (cluster_id, revision, repeats) VALUES ($1, $2, $3) \
    ON CONFLICT (cluster_id) DO UPDATE SET revision = GREATEST(audit_cursor.revision, EXCLUDED.revision), \
    repeats = EXCLUDED.repeats, updated_at = now()";

/// One statement for a batch's revision digests (a replay of a stored one is skipped).
const INSERT_HISTORY: &str = "INSERT INTO audit_history (cluster_id, revision, digest) \
    SELECT $1, * FROM unnest($2::bigint[], $3::bytea[]) ON CONFLICT (cluster_id, revision) DO NOTHING";

/// The highest revision of `cluster` the tailer has stored: every revision up to it has
/// been read (`None` before the first batch).
///
/// # Errors
///
/// [`AuditError::Database`] when the query fails.
pub async fn tailer_position<C: GenericClient>(
    client: &C,
    cluster: ClusterId,
) -> Result<Option<Revision>, AuditError> {
    let row = client
        .query_one(
            "SELECT GREATEST(\
                (SELECT revision FROM audit_cursor WHERE cluster_id = $1), \
                (SELECT max(revision) FROM audit_event WHERE cluster_id = $1), \
                (SELECT max(gap_to) FROM audit_event WHERE cluster_id = $1))",
            &[&cluster.to_sql()],
        )
        .await?;
    let rev: Option<i64> = row.get(0);
    Ok(rev.and_then(|r| Revision::from_i64(r).ok()))
}

/// Tails one etcd cluster's lock key space, epoch records and rehome switches into the
/// audit database. See the [module docs](self).
///
/// ```no_run
/// # async fn demo(pool: deadpool_postgres::Pool) -> Result<(), palisade_audit::AuditError> {
/// let tailer = palisade_audit::Tailer::connect(&["http://127.0.0.1:2379".to_owned()], None, pool).await?;
/// tokio::spawn(tailer.run());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Tailer {
    client: Client,
    pool: Pool,
    root: String,
    backoff_min: Duration,
    backoff_max: Duration,
}

impl std::fmt::Debug for Tailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tailer")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// One read (a key's count) through `client`, so that a client that cannot reach etcd
/// (no member answers, TLS refused) fails at connect, naming why, instead of retrying
/// quietly.
pub(crate) async fn probe(client: &Client) -> Result<(), AuditError> {
    let mut kv = client.kv_client();
    let read = kv.get("health", Some(GetOptions::new().with_count_only()));
    match tokio::time::timeout(ETCD_TIMEOUT, read).await {
        Ok(r) => r.map(drop).map_err(AuditError::from),
        Err(_) => Err(AuditError::EtcdTimeout(ETCD_TIMEOUT)),
    }
}

impl Tailer {
    /// A tailer of the key space under [`palisade_api::keys::DEFAULT_ROOT`], retrying after
    /// failures with a backoff from 100 ms to 5 s.
    pub fn new(client: Client, pool: Pool) -> Self {
        Tailer {
            client,
            pool,
            root: palisade_api::keys::DEFAULT_ROOT.to_owned(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }

    /// Connects to etcd (`http://host:port` endpoints, or `https://host:port` with `tls`, as
    /// `palisade_lock::EtcdTls::tls_options` makes it)
    /// and makes a tailer as [`Tailer::new`].
    ///
    /// # Errors
    ///
    /// [`AuditError::Etcd`] when no connection can be made or the first read fails (a
    /// TLS handshake refused, say); [`AuditError::EtcdTimeout`] when no member answers
    /// it within 5 s.
    pub async fn connect(
        endpoints: &[String],
        tls: Option<TlsOptions>,
        pool: Pool,
    ) -> Result<Self, AuditError> {
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_keep_alive(ETCD_KEEPALIVE_INTERVAL, ETCD_TIMEOUT);
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        let client = Client::connect(endpoints, Some(options)).await?;
        probe(&client).await?;
        Ok(Tailer::new(client, pool))
    }

    /// Another root prefix (as the lockers' `LockerOptions::with_root`; a `/` is
    /// appended if missing).
    #[must_use]
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        let mut root = root.into();
        if !root.ends_with('/') {
            root.push('/');
        }
        self.root = root;
        self
    }

    /// The shortest and longest wait before starting again after a failure (doubling in
    /// between; back to the shortest once a batch is stored).
    #[must_use]
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }

    /// Tails forever: failures of etcd or of the database are logged and retried after a
    /// backoff, from the stored position. Stop it by dropping or aborting the future (at
    /// any point: nothing is lost or stored twice).
    pub async fn run(self) -> Infallible {
        let mut delay = self.backoff_min;
        loop {
            let mut progressed = false;
            let e = match self.tail(&mut progressed).await {
                Ok(never) => match never {},
                Err(e) => e,
            };
            if progressed {
                delay = self.backoff_min;
            }
            tracing::warn!(error = %e, retry_in = ?delay, "audit tailer stopped; starting again");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(self.backoff_max);
        }
    }

    /// Reads the cluster id and the stored position, then watches and stores until
    /// something fails. Sets `progressed` once a batch is stored.
    async fn tail(&self, progressed: &mut bool) -> Result<Infallible, AuditError> {
        let keys = RootKeys::new(&self.root);
        let prefix = keys.locks();
        let mut etcd = self.client.clone();
        let resp = tokio::time::timeout(
            ETCD_TIMEOUT,
            etcd.get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await
        .map_err(|_| AuditError::EtcdTimeout(ETCD_TIMEOUT))??;
        let cluster = ClusterId(resp.header().map_or(0, |h| h.cluster_id()));
        let (position, mut repeats) = db(async {
            let client = self.pool.get().await?;
            let position = tailer_position(&**client, cluster).await?;
            let repeats: Option<Vec<i64>> = client
                .query_opt(
                    "SELECT repeats FROM audit_cursor WHERE cluster_id = $1",
                    &[&cluster.to_sql()],
                )
                .await?
                .and_then(|r| r.get(0));
            Ok((position, repeats))
        })
        .await?;
        let mut position = position.map_or(0, Revision::as_i64);
        loop {
            let start = position + 1;
            let options = WatchOptions::new()
                .with_prefix()
                .with_prev_key()
                .with_start_revision(start);
            let (_watcher, mut stream) = etcd.watch(keys.root(), Some(options)).await?;
            loop {
                let Some(resp) = stream.message().await? else {
                    return Err(watch_error("the watch stream ended"));
                };
                if let Some(h) = resp.header() {
                    if h.cluster_id() != 0 && h.cluster_id() != cluster.0 {
                        return Err(watch_error("etcd answered for another cluster id"));
                    }
                }
                let compacted = resp.compact_revision();
                if compacted > 0 {
                    if compacted <= start {
                        return Err(watch_error("watch canceled for compaction below its start"));
                    }
                    // Revisions start..compacted are gone, the compaction revision itself
                    // in part (compaction drops its deletions): say so, go on after it.
                    let (from, to) = (revision(start)?, revision(compacted)?);
                    tracing::warn!(%cluster, from = start, to = compacted, "etcd compacted past the audit position");
                    let gap = [LockEvent::gap(cluster, from, to)];
                    let batch = Batch {
                        events: &gap,
                        epochs: &EpochChanges::default(),
                        digests: &[],
                    };
                    self.store(cluster, batch, position, compacted, &mut repeats)
                        .await?;
                    position = compacted;
                    *progressed = true;
                    break;
                }
                if resp.canceled() {
                    return Err(watch_error(&format!(
                        "watch canceled: {}",
                        resp.cancel_reason()
                    )));
                }
                let (changes, others): (Vec<Change>, Vec<Change>) = resp
                    .events()
                    .iter()
                    .filter_map(Change::from_event)
                    .partition(|c| c.key.starts_with(prefix.as_bytes()));
                let epochs = EpochChanges::of(cluster, &keys, &others);
                // The position moves with lock-key changes only (restored history is
                // compared over them); epoch rows of a batch without any are stored
                // again on a replay, which their keys make harmless.
                let last = changes.iter().map(|c| c.revision).max();
                if last.is_none() && epochs.is_empty() {
                    continue;
                }
                let through = last.unwrap_or(position);
                let ends = lease_ends(&keys, &others);
                let events = classify(cluster, &keys, &changes, &ends);
                let digests = restored::digests(&changes);
                let batch = Batch {
                    events: &events,
                    epochs: &epochs,
                    digests: &digests,
                };
                self.store(cluster, batch, position, through, &mut repeats)
                    .await?;
                position = position.max(through);
                *progressed = true;
            }
        }
    }

    /// In one transaction: compares the revisions of the batch's digests (those after
    /// `after`) with audited history (see [`restored`]), stores its lock events but those
    /// of repeated revisions, its epoch rows (a stored record is skipped by its key), the
    /// digests, and moves the position to `through` with the clusters still repeated.
    /// `repeats` is updated once the transaction committed.
    async fn store(
        &self,
        cluster: ClusterId,
        batch: Batch<'_>,
        after: i64,
        through: i64,
        repeats: &mut Option<Vec<i64>>,
    ) -> Result<(), AuditError> {
        let Batch {
            events,
            epochs,
            digests,
        } = batch;
        let still = db(async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            let compared =
                restored::compare(&*tx, cluster, after, repeats.as_deref(), digests).await?;
            if compared.repeated.is_empty() {
                insert_lock_events(&*tx, events).await?;
            } else {
                let new: Vec<LockEvent> = events
                    .iter()
                    .filter(|e| !compared.repeated.contains(&e.revision.as_i64()))
                    .cloned()
                    .collect();
                insert_lock_events(&*tx, &new).await?;
                tracing::info!(
                    %cluster,
                    from = compared.repeated.first(),
                    to = compared.repeated.last(),
                    "etcd history repeats an audited cluster's: its events are stored already"
                );
            }
            insert_epoch_advances(&*tx, &epochs.advances).await?;
            insert_rehome_switches(&*tx, &epochs.switches).await?;
            if !digests.is_empty() {
                let (revs, sums): (Vec<i64>, Vec<&[u8]>) =
                    digests.iter().map(|(r, d)| (*r, d.as_slice())).unzip();
                tx.execute(INSERT_HISTORY, &[&cluster.to_sql(), &revs, &sums])
                    .await?;
            }
            tx.execute(
                UPSERT_CURSOR,
                &[&cluster.to_sql(), &through, &compared.repeats],
            )
            .await?;
            tx.commit().await?;
            Ok(compared.repeats)
        })
        .await?;
        *repeats = still;
        Ok(())
    }
}

/// What one watch response stores.
struct Batch<'a> {
    events: &'a [LockEvent],
    epochs: &'a EpochChanges,
    digests: &'a [(i64, Vec<u8>)],
}

async fn db<T>(
    f: impl std::future::Future<Output = Result<T, AuditError>>,
) -> Result<T, AuditError> {
    tokio::time::timeout(DB_TIMEOUT, f)
        .await
        .map_err(|_| AuditError::Timeout(DB_TIMEOUT))?
}

fn watch_error(what: &str) -> AuditError {
    AuditError::Etcd(etcd_client::Error::WatchError(what.to_owned()))
}

fn revision(r: i64) -> Result<Revision, AuditError> {
    Revision::from_i64(r).map_err(|e| watch_error(&format!("revision {r} out of range: {e}")))
}

mod classify;
mod epochs;
#[cfg(test)]
mod tests;
