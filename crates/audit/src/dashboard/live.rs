//! What only etcd knows now: the holds and waiters of the lock key space, and each
//! namespace's `cluster_tier` as stored in its config record.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, SortOrder, SortTarget, TlsOptions};
use palisade_api::keys::{LockEntry, RootKeys};

use crate::{tailer_position, AuditError, ClusterId};

/// How long one etcd read of the dashboard may take.
const ETCD_TIMEOUT: Duration = Duration::from_secs(2);

/// A read-only view of the lock service's etcd key space for the dashboard: the live
/// counts of the overview and the tiers of the timeline. It never writes to etcd.
///
/// ```no_run
/// # async fn example(pool: deadpool_postgres::Pool) -> Result<(), palisade_audit::AuditError> {
/// let etcd = etcd_client::Client::connect(["http://127.0.0.1:2379"], None).await?;
/// let live = palisade_audit::dashboard::Live::new(etcd, "/palisade/");
/// let app = palisade_audit::dashboard::router_with_live(pool, live);
/// # drop(app); Ok(()) }
/// ```
#[derive(Clone)]
pub struct Live {
    client: Client,
    keys: RootKeys,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("root", &self.keys.root())
            .finish_non_exhaustive()
    }
}

/// Holds and waiters in etcd at one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    pub(crate) holds: u64,
    pub(crate) waiters: u64,
}

impl Live {
    /// Reads the key space under `root` (the lock service's `--root`, default
    /// `/palisade/`) through `client`.
    pub fn new(client: Client, root: &str) -> Self {
        Live {
            client,
            keys: RootKeys::new(root),
        }
    }

    /// Connects to the etcd members at `endpoints` (`http://host:port`, or
    /// `https://host:port` with `tls`) for the key space under `root`.
    ///
    /// # Errors
    ///
    /// [`AuditError::Etcd`] when the endpoints do not parse, no connection can be made or
    /// the first read fails; [`AuditError::EtcdTimeout`] when no member answers it.
    pub async fn connect(
        endpoints: &[String],
        tls: Option<TlsOptions>,
        root: &str,
    ) -> Result<Self, AuditError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_timeout(ETCD_TIMEOUT);
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        let client = Client::connect(endpoints, Some(options)).await?;
        crate::tailer::probe(&client).await?;
        Ok(Live::new(client, root))
    }

    async fn get(
        &self,
        prefix: String,
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, AuditError> {
        let mut kv = self.client.kv_client();
        match tokio::time::timeout(ETCD_TIMEOUT, kv.get(prefix, Some(options))).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(AuditError::EtcdTimeout(ETCD_TIMEOUT)),
        }
    }

    /// Counts the hold and waiter keys under `locks/` (keys only, one read): each
    /// `h/<mode>/<lease>` is a hold, each `q/<mode>/<lease>` a waiter, if etcd keeps it
    /// on that lease (a lease-less copy is nobody's: palisade-api's key rules).
    pub(crate) async fn now(&self) -> Result<Now, AuditError> {
        let r = self
            .get(
                self.keys.locks(),
                GetOptions::new().with_prefix().with_keys_only(),
            )
            .await?;
        let mut now = Now {
            holds: 0,
            waiters: 0,
        };
        for kv in r.kvs() {
            match self.keys.parse_lock_entry(kv.key()).map(|e| e.entry) {
                Some(LockEntry::Hold(_, l)) if l.get() == kv.lease() => now.holds += 1,
                Some(LockEntry::Waiter(_, l)) if l.get() == kv.lease() => now.waiters += 1,
                _ => {}
            }
        }
        Ok(now)
    }

    /// Each namespace's `cluster_tier`, from the records under `config/ns/`.
    pub(crate) async fn tiers(&self) -> Result<HashMap<String, String>, AuditError> {
        let prefix = self.keys.namespace("");
        let r = self
            .get(prefix.clone(), GetOptions::new().with_prefix())
            .await?;
        let mut tiers = HashMap::new();
        for kv in r.kvs() {
            let Some(ns) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                continue;
            };
            let tier = serde_json::from_slice::<serde_json::Value>(kv.value())
                .ok()
                .and_then(|v| v.get("cluster_tier")?.as_str().map(str::to_owned));
            if let Some(tier) = tier {
                tiers.insert(ns.to_owned(), tier);
            }
        }
        Ok(tiers)
    }

    /// How far the tailer is behind etcd: the newest modification revision of a key
    /// under `locks/` that etcd still holds, minus the tailer's position for this
    /// cluster (0 when it is caught up). Changes whose keys are gone (a release's
    /// deletes) only show once a later key is written, so this is a lower bound.
    pub(crate) async fn tailer_behind<C: tokio_postgres::GenericClient>(
        &self,
        db: &C,
    ) -> Result<u64, AuditError> {
        let r = self
            .get(
                self.keys.locks(),
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(SortTarget::Mod, SortOrder::Descend)
                    .with_limit(1),
            )
            .await?;
        let cluster = ClusterId(r.header().map_or(0, |h| h.cluster_id()));
        let newest = r
            .kvs()
            .first()
            .map_or(0, |kv| kv.mod_revision().max(0) as u64);
        let position = tailer_position(db, cluster).await?.map_or(0, |p| p.get());
        Ok(newest.saturating_sub(position))
    }
}
