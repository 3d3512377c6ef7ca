//! [`LockerInner`]: the state one locker shares with its acquires, holds and sessions.
//! Every module of the lock core that needs the etcd client, the key space or the
//! epoch takes it from here, so none of them depends on [`crate::locker`].

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;

use crate::class_cache::{ClassCache, WatchGuard};
use crate::epoch::{adopt_advanced, EpochState};
use crate::handover::Successors;
use crate::lock_watch::LockWatches;
use crate::session_cache::SessionCache;
use crate::watches::Watches;
use palisade_api::keys::RootKeys;

/// What a [`Locker`](crate::Locker) shares with everything it hands out.
pub(crate) struct LockerInner {
    pub(crate) client: Client,
    /// The KV service alone, for the acquire and release Txns: a clone per call of it
    /// is one service's handle, not the whole client's (every service's).
    pub(crate) kv: etcd_client::KvClient,
    pub(crate) keys: RootKeys,
    pub(crate) epoch: Arc<EpochState>,
    pub(crate) request_timeout: Duration,
    /// The watch streams shared by every wait of this locker's acquires.
    pub(crate) watches: Watches,
    /// One watch per lock with waiters, on those streams, shared by its waiters.
    pub(crate) lock_watches: LockWatches,
    /// Whom forgotten holds hand over to, for `release_by`.
    pub(crate) successors: Successors,
    pub(crate) classes: Arc<ClassCache>,
    /// Ends the class cache's watch task with the locker.
    pub(crate) _class_watch: WatchGuard,
    /// Detached session records and the quota slots taken through this locker.
    pub(crate) sessions: Arc<SessionCache>,
}

impl LockerInner {
    /// Adopts an epoch another locker advanced, if both records agree on it (see
    /// [`adopt_advanced`]). Returns whether this locker now grants under it.
    pub(crate) async fn adopt_advanced_epoch(&self) -> bool {
        adopt_advanced(&self.client, &self.keys, &self.epoch, self.request_timeout).await
    }
}
