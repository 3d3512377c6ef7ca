//! [`LockerInner`]: the state one locker shares with its acquires, holds and sessions.
//! Every module of the lock core that needs the etcd client, the key space or the
//! epoch takes it from here, so none of them depends on [`crate::locker`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::Notify;

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
    /// The cleanups of dropped acquires still running.
    pub(crate) cleanups: Arc<Cleanups>,
}

/// The cleanups that dropped acquires spawn (see `acquire::guard`), counted, so that a
/// process that stops can let them finish ([`Locker::settle`](crate::Locker::settle))
/// instead of leaving waiter keys until their sessions' leases end.
#[derive(Default)]
pub(crate) struct Cleanups {
    running: AtomicUsize,
    done: Notify,
    /// Set once the process settles: cleanups waiting out a retry grace go at once.
    settling: AtomicBool,
    settle: Notify,
}

impl Cleanups {
    /// Waits `grace`, or less once the process settles ([`Cleanups::settled`]).
    pub(crate) async fn grace(&self, grace: Duration) {
        let settle = self.settle.notified();
        tokio::pin!(settle);
        settle.as_mut().enable();
        if self.settling.load(Ordering::SeqCst) {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            () = settle => {}
        }
    }

    /// Counts one cleanup until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> CleanupRunning {
        self.running.fetch_add(1, Ordering::SeqCst);
        CleanupRunning(Arc::clone(self))
    }

    /// Completes when no cleanup is running; ends every retry grace first.
    pub(crate) async fn settled(&self) {
        self.settling.store(true, Ordering::SeqCst);
        self.settle.notify_waiters();
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }
}

/// One running cleanup, counted in [`Cleanups`] until dropped.
pub(crate) struct CleanupRunning(Arc<Cleanups>);

impl Drop for CleanupRunning {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.done.notify_waiters();
        }
    }
}

impl LockerInner {
    /// Adopts an epoch another locker advanced, if both records agree on it (see
    /// [`adopt_advanced`]). Returns whether this locker now grants under it.
    pub(crate) async fn adopt_advanced_epoch(&self) -> bool {
        adopt_advanced(&self.client, &self.keys, &self.epoch, self.request_timeout).await
    }
}
