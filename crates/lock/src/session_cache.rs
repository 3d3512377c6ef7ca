//! The session cache of a [`Locker`](crate::Locker): detached session records (owner,
//! TTL, create revision) by lease, and the `held_lease_quota` slot each hold or wait of
//! a session took through this locker, so that the service's acquire and release need
//! no read of `sessions/<lease>` or of the namespace's slots.
//!
//! Rules:
//!
//! - A record is filled from a read of etcd (the first call for a session on a locker
//!   reads it) and served only while a watch on `<root>sessions/` is established. Any
//!   event under a session's keys (its record put or deleted, its lease ended, a force
//!   notice) drops that session's entries; the watch going down drops everything and
//!   serves nothing until it is back. A read that began before a drop does not fill the
//!   cache after it (a generation, as in the class cache).
//! - A cached record is never trusted alone to write: the Txns that act for a session
//!   compare its record's create revision with the cached one (the acquire's first Txn,
//!   the release Txn), so a record replaced or gone since fails them and the caller reads
//!   again. The service's keepalive and close still read the record (keepalive answers
//!   the session's force notices), and a keepalive or revoke that finds the lease gone
//!   drops it here.
//! - A slot remembered here is deleted only through a compare on its value (unique per
//!   take), so a stale entry frees nothing but its own take.
//!
//! Bounded: past [`MAX_ENTRIES`] sessions (or slots), the map is emptied and refilled by
//! reads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{Client, WatchOptions};
use tokio::sync::oneshot;

use crate::detached::SessionRecord;
use palisade_api::LeaseId;

/// The most sessions (and, separately, slots) kept before the cache is emptied.
const MAX_ENTRIES: usize = 1 << 16;

/// A taken slot: its key and its value (see `palisade_api::keys::RootKeys::quota_slot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRef {
    pub(crate) key: String,
    pub(crate) value: String,
}

#[derive(Default)]
struct State {
    live: bool,
    generation: u64,
    records: HashMap<LeaseId, SessionRecord>,
    /// Slots by session, then by taker (`RootKeys::quota_taker`).
    slots: HashMap<LeaseId, HashMap<String, SlotRef>>,
    slot_count: usize,
}

/// The cache; shared by the locker and its watch task.
#[derive(Default)]
pub(crate) struct SessionCache {
    state: Mutex<State>,
    watch: OnceLock<oneshot::Sender<()>>,
}

impl SessionCache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the watch on `prefix` (`<root>sessions/`) once; it stops when the cache is
    /// dropped.
    pub(crate) fn start(
        self: &Arc<Self>,
        client: &Client,
        prefix: &str,
        request_timeout: Duration,
    ) {
        if self.watch.get().is_some() {
            return;
        }
        let (stop, stopped) = oneshot::channel::<()>();
        if self.watch.set(stop).is_err() {
            return;
        }
        tokio::spawn(follow(
            client.clone(),
            prefix.to_owned(),
            Arc::downgrade(self),
            stopped,
            request_timeout,
        ));
    }

    /// The cached record of `lease`, while the watch is up.
    pub(crate) fn get(&self, lease: LeaseId) -> Option<SessionRecord> {
        let s = self.state();
        if !s.live {
            return None;
        }
        s.records.get(&lease).cloned()
    }

    /// The generation before a read from etcd, to hand to [`SessionCache::fill`].
    pub(crate) fn generation(&self) -> u64 {
        self.state().generation
    }

    /// Keeps a record read from etcd (without its force notices), unless anything was
    /// dropped since `generation`.
    pub(crate) fn fill(&self, generation: u64, record: &SessionRecord) {
        let mut s = self.state();
        if s.generation != generation {
            return;
        }
        if s.records.len() >= MAX_ENTRIES {
            s.records.clear();
        }
        let mut record = record.clone();
        record.forced.clear();
        s.records.insert(record.lease, record);
    }

    /// Drops what is known of `lease`: its record and its slots.
    pub(crate) fn forget(&self, lease: LeaseId) {
        let mut s = self.state();
        s.generation += 1;
        s.records.remove(&lease);
        if let Some(gone) = s.slots.remove(&lease) {
            s.slot_count -= gone.len();
        }
    }

    /// Remembers the slot `taker` of `lease` took.
    /// Returns the slot it replaces, one an earlier take of `taker` left here.
    pub(crate) fn keep_slot(
        &self,
        lease: LeaseId,
        taker: String,
        slot: SlotRef,
    ) -> Option<SlotRef> {
        let mut s = self.state();
        if s.slot_count >= MAX_ENTRIES {
            s.slots.clear();
            s.slot_count = 0;
        }
        let replaced = s.slots.entry(lease).or_default().insert(taker, slot);
        if replaced.is_none() {
            s.slot_count += 1;
        }
        replaced
    }

    /// The slot `taker` of `lease` took through this locker, forgotten here.
    pub(crate) fn take_slot(&self, lease: LeaseId, taker: &str) -> Option<SlotRef> {
        let mut s = self.state();
        let of_lease = s.slots.get_mut(&lease)?;
        let slot = of_lease.remove(taker)?;
        if of_lease.is_empty() {
            s.slots.remove(&lease);
        }
        s.slot_count -= 1;
        Some(slot)
    }

    fn clear(&self, live: bool) {
        let mut s = self.state();
        s.records.clear();
        s.generation += 1;
        s.live = live;
    }
}

/// Follows the watch until the cache is dropped or `stopped` fires, re-establishing it
/// after any failure (backoff up to 2 s).
async fn follow(
    client: Client,
    prefix: String,
    cache: Weak<SessionCache>,
    mut stopped: oneshot::Receiver<()>,
    timeout: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            () = watch_once(&client, &prefix, &cache, timeout) => {}
        }
        match cache.upgrade() {
            Some(c) => c.clear(false),
            None => return,
        }
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The lease a key under `<root>sessions/` belongs to (its first segment).
fn lease_of(key: &[u8], prefix: &str) -> Option<LeaseId> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    let id = rest.split(|&b| b == b'/').next()?;
    LeaseId::from_hex(std::str::from_utf8(id).ok()?)
}

async fn watch_once(client: &Client, prefix: &str, cache: &Weak<SessionCache>, timeout: Duration) {
    let mut c = client.clone();
    let created = tokio::time::timeout(
        timeout,
        c.watch(prefix, Some(WatchOptions::new().with_prefix())),
    )
    .await;
    let Ok(Ok((_watcher, mut stream))) = created else {
        return;
    };
    // Established: anything written from now on is delivered; anything cached before may
    // be stale.
    match cache.upgrade() {
        Some(c) => c.clear(true),
        None => return,
    }
    loop {
        let resp = match stream.message().await {
            Ok(Some(resp)) if !resp.canceled() => resp,
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "session cache: watch failed");
                return;
            }
        };
        let Some(cache) = cache.upgrade() else {
            return;
        };
        for event in resp.events() {
            match event.kv().and_then(|kv| lease_of(kv.key(), prefix)) {
                Some(lease) => cache.forget(lease),
                // Not a key this cache knows the shape of: drop everything.
                None => cache.clear(true),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_api::SpiffeId;
    use palisade_fence::Revision;

    fn record(lease: i64) -> SessionRecord {
        SessionRecord {
            lease: LeaseId::new(lease),
            spiffe_id: SpiffeId::new("spiffe://t/a").unwrap(),
            ttl: Duration::from_secs(10),
            opened_rev: Revision::new(7),
            forced: Vec::new(),
        }
    }

    #[test]
    fn served_only_while_live_and_fresh_reads_only() {
        let cache = SessionCache::default();
        let g = cache.generation();
        cache.fill(g, &record(1));
        assert!(cache.get(LeaseId::new(1)).is_none(), "not before the watch");
        cache.clear(true);
        let g = cache.generation();
        cache.fill(g, &record(1));
        assert_eq!(cache.get(LeaseId::new(1)), Some(record(1)));
        // A read that began before a drop does not fill.
        let before = cache.generation();
        cache.forget(LeaseId::new(2));
        cache.fill(before, &record(2));
        assert!(cache.get(LeaseId::new(2)).is_none());
        // An event of the session drops it; the watch going down drops everything.
        cache.forget(LeaseId::new(1));
        assert!(cache.get(LeaseId::new(1)).is_none());
        let g = cache.generation();
        cache.fill(g, &record(1));
        cache.clear(false);
        assert!(cache.get(LeaseId::new(1)).is_none());
    }

    #[test]
    fn slots_are_kept_per_session_and_go_with_it() {
        let cache = SessionCache::default();
        let slot = |k: &str| SlotRef {
            key: k.into(),
            value: "v".into(),
        };
        cache.keep_slot(LeaseId::new(1), "a".into(), slot("s1"));
        cache.keep_slot(LeaseId::new(1), "b".into(), slot("s2"));
        cache.keep_slot(LeaseId::new(2), "a".into(), slot("s3"));
        assert_eq!(cache.take_slot(LeaseId::new(1), "a"), Some(slot("s1")));
        assert_eq!(cache.take_slot(LeaseId::new(1), "a"), None);
        cache.forget(LeaseId::new(1));
        assert_eq!(cache.take_slot(LeaseId::new(1), "b"), None);
        assert_eq!(cache.take_slot(LeaseId::new(2), "a"), Some(slot("s3")));
        assert_eq!(cache.state().slot_count, 0);
    }

    #[test]
    fn a_key_names_its_session() {
        let p = "/r/sessions/";
        let id = LeaseId::new(0x1234);
        assert_eq!(lease_of(format!("{p}{id}").as_bytes(), p), Some(id));
        assert_eq!(
            lease_of(format!("{p}{id}/forced/1").as_bytes(), p),
            Some(id)
        );
        assert_eq!(lease_of(b"/r/sessions/zz", p), None);
    }
}
