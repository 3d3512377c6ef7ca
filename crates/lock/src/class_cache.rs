//! The class cache of a [`Locker`](crate::Locker), kept current by a watch on the
//! config prefix.
//!
//! Acquire reads a lock's class on every call, so a locker caches classes. A cache entry
//! is served only while a watch on `<root>config/` is established; any event under that
//! prefix (a namespace or class written or deleted by any locker or replica) clears the
//! whole cache, so the next acquire reads etcd again. While the watch is down (etcd
//! unreachable, the member lost its leader, the stream broke), every acquire reads its
//! class from etcd, until the watch is established again (after a backoff of up to 2 s),
//! which clears the cache. So a class update reaches every locker within the watch's
//! delivery time while the watch is up, and at once while it is down and etcd answers.
//!
//! When etcd cannot answer that read (quorum lost), the last class this locker read is
//! used (`last_known`): acquire needs the class to decide between failing closed and an
//! unprotected grant, and a class changed during the outage cannot have been read by
//! anyone either.
//!
//! A read that started before an invalidation does not fill the cache after it: every
//! clear advances a generation, and a read's result is kept only if the generation is
//! unchanged since the read began.
//!
//! Namespace records (`config/ns/<ns>`, which the service reads on every call for its
//! quotas) are cached the same way, under the same watch and generation; there is no
//! last-known fallback for them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, WatchOptions};
use tokio::sync::oneshot;

use palisade_api::{LockClass, Namespace};

#[derive(Default)]
struct State {
    /// Whether the watch is established (entries may be served).
    live: bool,
    /// Advanced by every clear.
    generation: u64,
    /// Served while `live`; cleared by every config event.
    entries: HashMap<(String, String), Arc<LockClass>>,
    /// The last class read of each name, never cleared: the fallback when etcd cannot
    /// answer.
    last: HashMap<(String, String), Arc<LockClass>>,
    /// Namespace records: served while `live`; cleared by every config event.
    namespaces: HashMap<String, Arc<Namespace>>,
}

/// The cache; shared by the locker and its watch task.
#[derive(Default)]
pub(crate) struct ClassCache {
    state: Mutex<State>,
}

impl ClassCache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached class, while the watch is up.
    pub(crate) fn get(&self, ns: &str, class: &str) -> Option<Arc<LockClass>> {
        let s = self.state();
        if !s.live {
            return None;
        }
        s.entries.get(&(ns.to_owned(), class.to_owned())).cloned()
    }

    /// The generation before a read from etcd, to hand to [`ClassCache::fill`].
    pub(crate) fn generation(&self) -> u64 {
        self.state().generation
    }

    /// The last class read, whether or not the watch is up: for when etcd cannot answer.
    pub(crate) fn last_known(&self, ns: &str, class: &str) -> Option<Arc<LockClass>> {
        self.state()
            .last
            .get(&(ns.to_owned(), class.to_owned()))
            .cloned()
    }

    /// Keeps a class read from etcd: as the last known one, and to be served unless the
    /// cache was cleared since `generation`.
    pub(crate) fn fill(&self, generation: u64, class: Arc<LockClass>) {
        let mut s = self.state();
        let name = (class.ns_id.clone(), class.id.clone());
        if s.generation == generation {
            s.entries.insert(name.clone(), class.clone());
        }
        s.last.insert(name, class);
    }

    /// The cached namespace record, while the watch is up.
    pub(crate) fn namespace(&self, ns: &str) -> Option<Arc<Namespace>> {
        let s = self.state();
        if !s.live {
            return None;
        }
        s.namespaces.get(ns).cloned()
    }

    /// Keeps a namespace record read from etcd, to be served unless the cache was
    /// cleared since `generation`.
    pub(crate) fn fill_namespace(&self, generation: u64, ns: Arc<Namespace>) {
        let mut s = self.state();
        if s.generation == generation {
            s.namespaces.insert(ns.id.clone(), ns);
        }
    }

    /// Drops every served entry (a config change, or the watch just established); the
    /// cache may serve from now on.
    fn clear(&self) {
        let mut s = self.state();
        s.entries.clear();
        s.namespaces.clear();
        s.generation += 1;
        s.live = true;
    }

    /// The watch is down: nothing is served until it is back.
    fn suspend(&self) {
        self.state().live = false;
    }
}

/// Stops the watch task when dropped (with the locker).
pub(crate) struct WatchGuard {
    _stop: oneshot::Sender<()>,
}

/// Starts the task that keeps `cache` current: watches `prefix` (the config prefix) and
/// clears the cache on every event; re-establishes the watch after any failure.
pub(crate) fn spawn_watch(
    client: Client,
    prefix: String,
    cache: Arc<ClassCache>,
    request_timeout: Duration,
) -> WatchGuard {
    let (stop, mut stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                () = watch_once(&client, &prefix, &cache, request_timeout) => {}
            }
            // The watch is down: serve nothing from the cache until it is back.
            cache.suspend();
            tokio::select! {
                _ = &mut stopped => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    });
    WatchGuard { _stop: stop }
}

/// Establishes one watch and follows it until it fails, clearing the cache on events.
async fn watch_once(client: &Client, prefix: &str, cache: &ClassCache, timeout: Duration) {
    let mut c = client.clone();
    let created = tokio::time::timeout(
        timeout,
        c.watch(prefix, Some(WatchOptions::new().with_prefix())),
    )
    .await;
    let (_watcher, mut stream) = match created {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "class cache: watch not established");
            return;
        }
        Err(_) => return,
    };
    // Established: anything written from now on is delivered; anything cached before
    // may be stale.
    cache.clear();
    loop {
        match stream.message().await {
            Ok(Some(resp)) if resp.canceled() => {
                tracing::debug!(reason = resp.cancel_reason(), "class cache: watch canceled");
                return;
            }
            Ok(Some(resp)) => {
                if !resp.events().is_empty() {
                    cache.clear();
                }
            }
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "class cache: watch failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_only_while_live_fresh_reads_only_and_last_known_always() {
        let cache = ClassCache::default();
        let class = |prefix: &str| Arc::new(LockClass::new("ns", "c", prefix));
        // Before the watch is up: filled, not served, but known.
        let g = cache.generation();
        cache.fill(g, class("a/"));
        assert!(cache.get("ns", "c").is_none());
        assert_eq!(cache.last_known("ns", "c").unwrap().key_prefix, "a/");
        // Watch established: cleared; a read then fills and is served.
        cache.clear();
        assert!(cache.get("ns", "c").is_none());
        let g = cache.generation();
        cache.fill(g, class("b/"));
        assert_eq!(cache.get("ns", "c").unwrap().key_prefix, "b/");
        // A read that began before a config event does not refill the cache.
        let before = cache.generation();
        cache.clear();
        cache.fill(before, class("stale/"));
        assert!(cache.get("ns", "c").is_none());
        // The watch goes down: nothing served; the last read stays known.
        let g = cache.generation();
        cache.fill(g, class("c/"));
        cache.suspend();
        assert!(cache.get("ns", "c").is_none());
        assert_eq!(cache.last_known("ns", "c").unwrap().key_prefix, "c/");
    }

    #[test]
    fn namespaces_are_served_while_live_and_cleared_with_classes() {
        let cache = ClassCache::default();
        let ns = |quota: u32| {
            let mut n = Namespace::new("ns", "tenant");
            n.held_lease_quota = quota;
            Arc::new(n)
        };
        let g = cache.generation();
        cache.fill_namespace(g, ns(1));
        assert!(
            cache.namespace("ns").is_none(),
            "not served before the watch is up"
        );
        cache.clear();
        let g = cache.generation();
        cache.fill_namespace(g, ns(2));
        assert_eq!(cache.namespace("ns").unwrap().held_lease_quota, 2);
        // A config event clears it, and a read from before the event does not refill.
        let before = cache.generation();
        cache.clear();
        assert!(cache.namespace("ns").is_none());
        cache.fill_namespace(before, ns(3));
        assert!(cache.namespace("ns").is_none());
        let g = cache.generation();
        cache.fill_namespace(g, ns(4));
        cache.suspend();
        assert!(
            cache.namespace("ns").is_none(),
            "not served while the watch is down"
        );
    }
}
