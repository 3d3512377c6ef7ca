//! Namespaces and lock classes, stored as JSON under `<root>config/`, validated on write.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::retry;
use palisade_api::keys::{prefix_end, RootKeys};
use palisade_api::{validate_name, LockClass, Namespace};

/// Whose deadline a config read runs to: its own budget (the deadline passing is etcd's
/// failure, `QuorumLost`), or a caller's (attempts it cut short, with etcd never seen
/// failing, are `DeadlineExceeded`; see `retry::call`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    Own(Instant),
    Callers(Instant),
}

/// Reads and writes namespaces and classes. Get one from
/// [`Locker::config`](crate::Locker::config).
///
/// Writes validate first and write nothing when the input is refused: names are
/// `[a-z0-9][a-z0-9_-]{0,62}`, `ttl_min <= ttl_max`, a class's namespace exists, and a
/// class's key prefix does not overlap another class's prefix in the namespace (checked
/// against the classes read at one revision and committed only if none changed since).
#[derive(Clone)]
pub struct ConfigStore {
    client: Client,
    keys: RootKeys,
    request_timeout: Duration,
}

impl std::fmt::Debug for ConfigStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl ConfigStore {
    pub(crate) fn new(client: Client, keys: RootKeys, request_timeout: Duration) -> Self {
        ConfigStore {
            client,
            keys,
            request_timeout,
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.request_timeout * 3
    }

    async fn get(
        &self,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse> {
        retry::call("config.get", self.deadline(), self.request_timeout, || {
            let (mut c, key, options) = (self.client.clone(), key.clone(), options.clone());
            async move { c.get(key, options).await }
        })
        .await
        .map_err(|e| e.into_error(ErrorKind::QuorumLost))
    }

    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.txn_until(txn, Until::Own(self.deadline())).await
    }

    async fn txn_until(&self, txn: Txn, until: Until) -> Result<etcd_client::TxnResponse> {
        let (Until::Own(deadline) | Until::Callers(deadline)) = until;
        retry::call("config.txn", deadline, self.request_timeout, || {
            let (mut c, txn) = (self.client.clone(), txn.clone());
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| match until {
            Until::Own(_) => e.into_error(ErrorKind::QuorumLost),
            Until::Callers(_) => e.into_caller_error(ErrorKind::QuorumLost),
        })
    }

    /// Creates or replaces a namespace.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadName`]; [`InvalidInput::BadText`] for `tenant_id` or
    /// `cluster_tier` ([`Namespace::validate`]); [`ErrorKind::QuorumLost`] if etcd cannot
    /// commit.
    pub async fn put_namespace(&self, ns: &Namespace) -> Result<()> {
        ns.validate()?;
        let value =
            serde_json::to_vec(ns).map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
        self.txn(Txn::new().and_then([TxnOp::put(self.keys.namespace(&ns.id), value, None)]))
            .await?;
        Ok(())
    }

    /// The namespace, or `None`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadName`], [`ErrorKind::CorruptRecord`], [`ErrorKind::QuorumLost`].
    pub async fn namespace(&self, ns: &str) -> Result<Option<Namespace>> {
        validate_name(ns)?;
        let resp = self.get(self.keys.namespace(ns), None).await?;
        resp.kvs().first().map(|kv| decode(kv.value())).transpose()
    }

    /// Creates or replaces a class. Refused while the namespace is fenced on this cluster
    /// (`tier/fence/<ns>`: a rehome is moving it, or it lives on another tier), so that
    /// an edit made while a rehome copies the classes is not lost: the caller retries
    /// once the move is over, on the namespace's tier.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] (bad names, `ttl_min > ttl_max`, a bad prefix,
    /// [`InvalidInput::UnknownNamespace`], [`InvalidInput::PrefixOverlap`]);
    /// [`ErrorKind::NamespaceFenced`]; [`ErrorKind::QuorumLost`] if etcd cannot commit.
    pub async fn put_class(&self, class: &LockClass) -> Result<()> {
        self.store_class(class, true).await
    }

    /// [`ConfigStore::put_class`] whether or not the namespace is fenced here: a rehome's
    /// copy of the classes to the new tier, which it fenced itself.
    pub(crate) async fn copy_class(&self, class: &LockClass) -> Result<()> {
        self.store_class(class, false).await
    }

    async fn store_class(&self, class: &LockClass, refuse_fenced: bool) -> Result<()> {
        class.validate()?;
        let value = serde_json::to_vec(class)
            .map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))?;
        let ns_key = self.keys.namespace(&class.ns_id);
        let classes = self.keys.classes(&class.ns_id);
        let fence = self.keys.ns_fence(&class.ns_id);
        for _ in 0..8 {
            let resp = self
                .txn(Txn::new().and_then([
                    TxnOp::get(ns_key.clone(), None),
                    TxnOp::get(classes.clone(), Some(GetOptions::new().with_prefix())),
                    TxnOp::get(fence.clone(), Some(GetOptions::new().with_keys_only())),
                ]))
                .await?;
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let mut ranges = resp.op_responses().into_iter().filter_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => Some(g),
                _ => None,
            });
            let (ns_get, class_get, fence_get) = (ranges.next(), ranges.next(), ranges.next());
            if ns_get.is_none_or(|g| g.kvs().is_empty()) {
                return Err(Error::invalid(InvalidInput::UnknownNamespace(
                    class.ns_id.clone(),
                )));
            }
            if refuse_fenced && fence_get.is_some_and(|g| !g.kvs().is_empty()) {
                return Err(Error::new(ErrorKind::NamespaceFenced {
                    ns: class.ns_id.clone(),
                }));
            }
            for kv in class_get.iter().flat_map(|g| g.kvs()) {
                let other: LockClass = decode(kv.value())?;
                if other.id != class.id && other.overlaps(class) {
                    return Err(Error::invalid(InvalidInput::PrefixOverlap {
                        other: other.id,
                    }));
                }
            }
            let mut when = vec![
                Compare::version(ns_key.clone(), CompareOp::Greater, 0),
                // Every class of the namespace unchanged since the read (an empty
                // range compares as mod_revision 0, which passes).
                Compare::mod_revision(classes.clone(), CompareOp::Less, rev + 1)
                    .with_range(prefix_end(&classes)),
            ];
            if refuse_fenced {
                when.push(Compare::version(fence.clone(), CompareOp::Equal, 0));
            }
            let txn = Txn::new().when(when).and_then([TxnOp::put(
                self.keys.class(&class.ns_id, &class.id),
                value.clone(),
                None,
            )]);
            if self.txn(txn).await?.succeeded() {
                return Ok(());
            }
        }
        Err(Error::new(ErrorKind::QuorumLost))
    }

    /// The class, or a typed error naming what is missing.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownNamespace`], [`InvalidInput::UnknownClass`],
    /// [`InvalidInput::BadName`], [`ErrorKind::CorruptRecord`], [`ErrorKind::QuorumLost`].
    pub async fn class(&self, ns: &str, class: &str) -> Result<LockClass> {
        self.class_until(ns, class, Until::Own(self.deadline()))
            .await
    }

    /// [`ConfigStore::class`], retried until `until` at most.
    pub(crate) async fn class_until(
        &self,
        ns: &str,
        class: &str,
        until: Until,
    ) -> Result<LockClass> {
        validate_name(ns)?;
        validate_name(class)?;
        let resp = self
            .txn_until(
                Txn::new().and_then([
                    TxnOp::get(self.keys.namespace(ns), None),
                    TxnOp::get(self.keys.class(ns, class), None),
                ]),
                until,
            )
            .await?;
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        if gets.next().is_none_or(|g| g.kvs().is_empty()) {
            return Err(Error::invalid(InvalidInput::UnknownNamespace(
                ns.to_owned(),
            )));
        }
        match gets
            .next()
            .and_then(|g| g.kvs().first().map(|kv| kv.value().to_vec()))
        {
            Some(v) => decode(&v),
            None => Err(Error::invalid(InvalidInput::UnknownClass(class.to_owned()))),
        }
    }
}

impl ConfigStore {
    /// Every namespace, by name.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::CorruptRecord`], [`ErrorKind::QuorumLost`].
    pub async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let prefix = self.keys.namespace("");
        let resp = self
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await?;
        resp.kvs().iter().map(|kv| decode(kv.value())).collect()
    }

    /// Every class of a namespace, by name (empty if the namespace has none or does not
    /// exist).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadName`], [`ErrorKind::CorruptRecord`], [`ErrorKind::QuorumLost`].
    pub async fn classes(&self, ns: &str) -> Result<Vec<LockClass>> {
        validate_name(ns)?;
        let resp = self
            .get(self.keys.classes(ns), Some(GetOptions::new().with_prefix()))
            .await?;
        resp.kvs().iter().map(|kv| decode(kv.value())).collect()
    }
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::with_source(ErrorKind::CorruptRecord, e))
}
