//! [`Tiers`]: one [`Locker`] per etcd cluster (a *tier*), and which namespace lives on
//! which.
//!
//! - **The directory** is the namespace records on the *home* tier (`config/ns/<ns>`):
//!   a namespace lives on the tier its `cluster_tier` names, or on the home tier if that
//!   names no configured tier (so a deployment of one tier ignores the field, as
//!   before tiers existed). Each tier also holds the namespace's record and classes,
//!   which its locker reads to grant; a rehome copies them.
//! - **Sessions** are opened on one tier (a lease lives in one cluster) and acquire only
//!   in namespaces living on it: [`Tiers::route`] answers
//!   [`ErrorKind::WrongTier`] naming the tier otherwise.
//! - **Epochs** are one sequence across tiers: [`Tiers::advance_epoch`] starts an epoch
//!   above every epoch any tier used (each tier's current and durable record), bound
//!   to the cluster that serves it. Each tier keeps its own durable record, checked at
//!   start as for one cluster. A tier bootstrapped later starts at epoch 0 like any
//!   new key space; its namespaces have no earlier tokens, and a namespace rehomed to
//!   it gets an epoch above all.
//! - **Fences.** While `tier/fence/<ns>` exists in a cluster, no acquire's first Txn
//!   commits there in `<ns>` ([`ErrorKind::NamespaceFenced`]), and without a first Txn
//!   no waiter key, so no grant, appears. A rehome fences the old tier before the
//!   switch and lifts the new tier's fence after it, so at no moment do two tiers grant
//!   in one namespace. The old tier stays fenced after the move.
//!
//! The rehome protocol and its crash safety are in `rehome.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use palisade_api::{validate_name, EpochReason, EpochRecord, InvalidInput, Namespace};

mod rehome;

pub use rehome::{RehomeOutcome, DEFAULT_DRAIN, MAX_DRAIN};

/// The tier name a deployment of one etcd cluster uses, and the default of
/// [`Namespace::cluster_tier`].
pub const DEFAULT_TIER: &str = "default";

/// The etcd cluster tiers of one service: a [`Locker`] per tier, one of them the home
/// of the directory (see the module docs). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tiers {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    home: String,
    lockers: BTreeMap<String, Locker>,
}

impl Tiers {
    /// One tier, `name`, which is also the home.
    pub fn single(name: impl Into<String>, locker: Locker) -> Tiers {
        let home = name.into();
        Tiers {
            inner: Arc::new(Inner {
                lockers: BTreeMap::from([(home.clone(), locker)]),
                home,
            }),
        }
    }

    /// The tiers `tiers` (name and locker), `home` among them.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::BadName`] for a tier name that is not a name;
    /// [`InvalidInput::UnknownTier`] if `home` is not one of them or a name repeats;
    /// [`ErrorKind::SameClusterTiers`] if two lockers' epoch records name one etcd
    /// cluster.
    pub fn new(
        home: impl Into<String>,
        tiers: impl IntoIterator<Item = (String, Locker)>,
    ) -> Result<Tiers> {
        let home = home.into();
        let mut lockers = BTreeMap::new();
        let mut clusters: BTreeMap<u64, String> = BTreeMap::new();
        for (name, locker) in tiers {
            validate_name(&name)?;
            let cluster_id = locker.epoch().0.cluster_id;
            if let Some(other) = clusters.insert(cluster_id, name.clone()) {
                return Err(Error::new(ErrorKind::SameClusterTiers {
                    a: other,
                    b: name,
                    cluster_id,
                }));
            }
            if lockers.insert(name.clone(), locker).is_some() {
                return Err(Error::invalid(InvalidInput::UnknownTier(name)));
            }
        }
        if !lockers.contains_key(&home) {
            return Err(Error::invalid(InvalidInput::UnknownTier(home)));
        }
        Ok(Tiers {
            inner: Arc::new(Inner { home, lockers }),
        })
    }

    /// The home tier's name.
    pub fn home_name(&self) -> &str {
        &self.inner.home
    }

    /// The home tier's locker: the directory and its namespace records.
    pub fn home(&self) -> &Locker {
        &self.inner.lockers[&self.inner.home]
    }

    /// Every tier, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Locker)> {
        self.inner.lockers.iter().map(|(n, l)| (n.as_str(), l))
    }

    /// The locker of tier `name`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownTier`].
    pub fn locker(&self, name: &str) -> Result<&Locker> {
        self.inner
            .lockers
            .get(name)
            .ok_or_else(|| Error::invalid(InvalidInput::UnknownTier(name.to_owned())))
    }

    /// The tier a namespace record says it lives on: its `cluster_tier` if that is a
    /// configured tier, else the home tier.
    pub fn tier_of(&self, ns: &Namespace) -> &str {
        match self.inner.lockers.get_key_value(&ns.cluster_tier) {
            Some((name, _)) => name,
            None => &self.inner.home,
        }
    }

    /// The namespace's record in the directory (the home tier's, cached by its watch)
    /// and the tier it lives on; `None` for an unknown namespace.
    ///
    /// # Errors
    ///
    /// As [`Locker::namespace`].
    pub async fn namespace(&self, ns: &str) -> Result<Option<(String, Arc<Namespace>)>> {
        Ok(self
            .home()
            .namespace(ns)
            .await?
            .map(|n| (self.tier_of(&n).to_owned(), n)))
    }

    /// Where a session on tier `session_tier` may act in namespace `ns`: its record and
    /// the tier's locker.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::WrongTier`] naming the namespace's tier if it is not
    /// `session_tier`; [`InvalidInput::UnknownNamespace`]; as [`Locker::namespace`].
    pub async fn route(&self, ns: &str, session_tier: &str) -> Result<(Arc<Namespace>, &Locker)> {
        let (tier, record) = self
            .namespace(ns)
            .await?
            .ok_or_else(|| Error::invalid(InvalidInput::UnknownNamespace(ns.to_owned())))?;
        if tier != session_tier {
            return Err(Error::new(ErrorKind::WrongTier {
                ns: ns.to_owned(),
                tier,
            }));
        }
        Ok((record, self.locker(&tier)?))
    }

    /// Starts a new epoch on tier `tier`, above every epoch any tier used: the highest
    /// of every tier's current and durable epoch, plus one (see
    /// [`Locker::advance_epoch_above`]).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownTier`]; [`ErrorKind::EpochStore`] if a tier's durable
    /// record cannot be read (the new epoch could not be shown to be above it); as
    /// [`Locker::advance_epoch`].
    pub async fn advance_epoch(&self, tier: &str, reason: EpochReason) -> Result<EpochRecord> {
        let locker = self.locker(tier)?;
        let mut floor = palisade_fence::Epoch::ZERO;
        for (_, other) in self.iter() {
            floor = floor.max(other.highest_epoch().await?);
        }
        locker.advance_epoch_above(reason, floor).await
    }

    /// Moves namespace `ns` to tier `to` (see `rehome.rs` for the protocol): fences the
    /// old tier, waits up to `drain` for the namespace's holds and waiters there to
    /// end, copies its records, advances `to`'s epoch above every tier's, switches the
    /// directory, and lifts `to`'s fence. A rehome already moving `ns` to `to` (one
    /// that crashed, or failed after its switch) is resumed; a namespace already on
    /// `to` with no rehome in progress is answered at once.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownTier`], [`InvalidInput::UnknownNamespace`],
    /// [`InvalidInput::BadName`]; [`ErrorKind::RehomeInProgress`] if a rehome to another
    /// tier is under way; [`ErrorKind::DrainTimeout`] (rolled back); any error of a
    /// tier's etcd or epoch store: before the switch the rehome is rolled back where it
    /// can be (else a retry resumes it), after it a retry finishes it.
    pub async fn rehome(&self, ns: &str, to: &str, drain: Duration) -> Result<RehomeOutcome> {
        rehome::run(self, ns, to, drain).await
    }
}
