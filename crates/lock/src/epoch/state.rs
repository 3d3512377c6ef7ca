//! [`EpochState`]: the locker's running view of the current epoch, the checks on every
//! response header, and the reservation of grant revisions in the durable record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use etcd_client::ResponseHeader;
use palisade_fence::{Epoch, Revision};

use super::record::EpochStore;
use crate::error::{EpochMismatch, Error, ErrorKind, Result};
use palisade_api::EpochRecord;

/// The reservation window a locker uses unless told otherwise
/// ([`LockerOptions::with_epoch_window`](crate::LockerOptions::with_epoch_window)), in
/// etcd revisions.
pub const DEFAULT_EPOCH_WINDOW: u64 = 1024;

/// The largest reservation window a locker accepts, in etcd revisions: a restart may
/// have to write this many times to etcd before its first grant.
pub const MAX_EPOCH_WINDOW: u64 = 1 << 20;

/// The locker's view of the current epoch, the checks on every response header, and
/// the reservation of grant revisions in the durable record.
pub(crate) struct EpochState {
    store: Box<dyn EpochStore>,
    /// The reservation window W, in etcd revisions.
    window: u64,
    state: Mutex<State>,
    /// Held by whoever writes the durable record: concurrent grants share one write.
    flush: tokio::sync::Mutex<()>,
    /// A background flush is queued or running.
    background: AtomicBool,
}

#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) record: EpochRecord,
    /// mod_revision of `config/epoch` in etcd for this record; grants compare it.
    pub(crate) etcd_mod_rev: i64,
    pub(crate) mismatch: Option<EpochMismatch>,
}

struct State {
    current: Current,
    /// Bumped by every [`EpochState::replace`]: a flush computed for an older epoch
    /// record never counts for the new one.
    generation: u64,
    /// Highest grant revision minted (or about to be) in this epoch; the next flush
    /// confirms it.
    pending: u64,
    /// Highest revision seen in a checked response header in this epoch.
    seen: u64,
    /// The reservation known to be durable for this epoch: a grant at or below it is
    /// minted without a write.
    reserved: u64,
}

impl State {
    /// Revisions of the durable reservation not yet used by a grant or passed by etcd.
    fn reservation_left(&self) -> u64 {
        self.reserved - self.pending.max(self.seen).min(self.reserved)
    }

    fn of(current: Current) -> State {
        let (confirmed, reserved) = (
            current.record.highest_grant_rev.get(),
            current.record.reserved_rev.get(),
        );
        State {
            current,
            generation: 0,
            pending: confirmed,
            seen: confirmed,
            reserved: reserved.max(confirmed),
        }
    }
}

impl EpochState {
    /// `window` is W (at most [`MAX_EPOCH_WINDOW`]; the caller checks it).
    pub(crate) fn new(store: Box<dyn EpochStore>, window: u64, current: Current) -> Self {
        EpochState {
            store,
            window,
            state: Mutex::new(State::of(current)),
            flush: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn store(&self) -> &dyn EpochStore {
        &*self.store
    }

    pub(crate) fn snapshot(&self) -> Current {
        self.lock().current.clone()
    }

    /// The highest grant revision this locker minted a token for (or is about to) in the
    /// current epoch, at least the record's confirmed `highest_grant_rev`.
    pub(crate) fn minted(&self) -> u64 {
        self.lock().pending
    }

    /// Starts over with `current` (an advanced epoch).
    pub(crate) fn replace(&self, current: Current) {
        let mut s = self.lock();
        let generation = s.generation + 1;
        *s = State::of(current);
        s.generation = generation;
    }

    /// Adopts `current` (an epoch another locker advanced to) unless this locker is
    /// already at that epoch with no refusal (concurrent acquires may both try), or
    /// above it. `seen` is the revision of the response that found it. Returns whether
    /// the locker now grants under `current`'s epoch or a later one.
    pub(crate) fn adopt(&self, current: Current, seen: u64) -> bool {
        let mut s = self.lock();
        let (mine, theirs) = (s.current.record.epoch, current.record.epoch);
        if mine > theirs || (mine == theirs && s.current.mismatch.is_none()) {
            return s.current.mismatch.is_none();
        }
        let generation = s.generation + 1;
        *s = State::of(current);
        s.generation = generation;
        s.seen = s.seen.max(seen);
        true
    }

    /// Raises the highest revision seen (a response header this locker trusts).
    pub(crate) fn observe(&self, revision: u64) {
        let mut s = self.lock();
        s.seen = s.seen.max(revision);
    }

    fn poison(&self, why: EpochMismatch) -> Error {
        let mut s = self.lock();
        Error::epoch(s.current.mismatch.get_or_insert(why).clone())
    }

    /// The highest revision this locker granted at or saw in a checked response in this
    /// epoch; capture it before sending a request and pass it to [`EpochState::check`]
    /// with the response.
    pub(crate) fn high_water(&self) -> u64 {
        let s = self.lock();
        s.pending.max(s.seen)
    }

    /// Refuses if the epoch is poisoned, or the header names another cluster, or its
    /// revision is behind `hw_at_send` (for a grant: not above it, since a grant sent
    /// after a revision was seen must commit after it). Every request checked here is a
    /// linearizable Txn, so its revision is at least every revision seen before it was
    /// sent; a lower one means etcd's revisions went back (a restore), even between
    /// grants.
    pub(crate) fn check(
        &self,
        header: Option<&ResponseHeader>,
        hw_at_send: u64,
        is_grant: bool,
    ) -> Result<()> {
        let cur = self.snapshot();
        if let Some(m) = cur.mismatch {
            return Err(Error::epoch(m));
        }
        match header {
            Some(h) => {
                self.check_seen(&cur, h.cluster_id(), h.revision(), hw_at_send, is_grant)?;
                self.observe(h.revision().max(0) as u64);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn check_seen(
        &self,
        cur: &Current,
        cluster_id: u64,
        revision: i64,
        hw_at_send: u64,
        is_grant: bool,
    ) -> Result<()> {
        if cluster_id != cur.record.cluster_id {
            return Err(self.poison(EpochMismatch::ClusterId {
                recorded: cur.record.cluster_id,
                actual: cluster_id,
            }));
        }
        let rev = revision.max(0) as u64;
        if rev < hw_at_send || (is_grant && rev == hw_at_send && hw_at_send > 0) {
            return Err(self.poison(EpochMismatch::RevisionBehind {
                recorded: Revision::new(hw_at_send),
                actual: Revision::new(rev),
            }));
        }
        Ok(())
    }

    /// Takes note of a response that is not linearizable (a watch message, which a
    /// lagging member may send): its revision only raises the high water (it was
    /// committed, so every later linearizable answer is at or above it), and a header
    /// of another cluster refuses grants as [`EpochState::check`] does. Used so that a
    /// locker whose acquires sit in watches still tracks how far etcd has moved.
    ///
    /// # Errors
    ///
    /// [`EpochMismatch`] if the epoch refuses grants or the header names another cluster.
    pub(crate) fn observe_header(&self, header: Option<&ResponseHeader>) -> Result<()> {
        let cur = self.snapshot();
        if let Some(m) = cur.mismatch {
            return Err(Error::epoch(m));
        }
        let Some(h) = header else { return Ok(()) };
        if h.cluster_id() != cur.record.cluster_id {
            return Err(self.poison(EpochMismatch::ClusterId {
                recorded: cur.record.cluster_id,
                actual: h.cluster_id(),
            }));
        }
        self.observe(h.revision().max(0) as u64);
        Ok(())
    }

    /// Marks the epoch key as changed elsewhere.
    pub(crate) fn advanced_elsewhere(&self) -> Error {
        self.poison(EpochMismatch::Advanced)
    }

    /// Returns once a token for `grant_rev` in `epoch` may be handed out: at once if the
    /// durable reservation covers it (and, once less than half the window is left, with
    /// a background write raising it), else after a write that raises the reservation
    /// to the highest revision pending plus the window (concurrent callers share it).
    ///
    /// # Errors
    ///
    /// [`EpochMismatch`] if the epoch is refusing grants, or [`EpochMismatch::Advanced`]
    /// if it is no longer `epoch`; [`ErrorKind::EpochStore`] if the write failed.
    pub(crate) async fn commit(self: &Arc<Self>, epoch: Epoch, grant_rev: Revision) -> Result<()> {
        let g = grant_rev.get();
        let generation = {
            let mut s = self.lock();
            if let Some(m) = &s.current.mismatch {
                return Err(Error::epoch(m.clone()));
            }
            if s.current.record.epoch != epoch {
                return Err(Error::epoch(EpochMismatch::Advanced));
            }
            s.pending = s.pending.max(g);
            if g <= s.reserved {
                let left = s.reservation_left();
                let generation = s.generation;
                drop(s);
                if left < self.window / 2 {
                    self.flush_in_background(generation);
                }
                return Ok(());
            }
            s.generation
        };
        loop {
            let _flusher = self.flush.lock().await;
            {
                let s = self.lock();
                if s.generation != generation {
                    return Err(Error::epoch(EpochMismatch::Advanced));
                }
                if g <= s.reserved {
                    return Ok(());
                }
            }
            self.flush_locked(generation).await?;
        }
    }

    fn flush_in_background(self: &Arc<Self>, generation: u64) {
        if self.background.swap(true, Ordering::SeqCst) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let _flusher = this.flush.lock().await;
            let needed = {
                let s = this.lock();
                s.generation == generation && s.reservation_left() < this.window / 2
            };
            if needed {
                if let Err(e) = this.flush_locked(generation).await {
                    // The next grant past the reservation writes (and reports) again.
                    tracing::warn!(error = %e, "raising the epoch reservation failed");
                }
            }
            this.background.store(false, Ordering::SeqCst);
        });
    }

    /// One durable write (the caller holds `flush`): confirms the highest grant revision
    /// pending and reserves up to the highest revision pending or seen plus the window.
    async fn flush_locked(&self, generation: u64) -> Result<()> {
        let record = {
            let s = self.lock();
            if s.generation != generation {
                return Err(Error::epoch(EpochMismatch::Advanced));
            }
            let mut record = s.current.record.clone();
            let confirmed = record.highest_grant_rev.get().max(s.pending);
            let reserved = s
                .reserved
                .max(s.pending.max(s.seen).saturating_add(self.window))
                .max(confirmed);
            record.highest_grant_rev = Revision::new(confirmed);
            record.reserved_rev = Revision::new(reserved);
            record
        };
        self.store
            .store(record.clone())
            .await
            .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
        let mut s = self.lock();
        if s.generation == generation {
            s.reserved = s.reserved.max(record.reserved_rev.get());
            let r = &mut s.current.record;
            r.highest_grant_rev = r.highest_grant_rev.max(record.highest_grant_rev);
            r.reserved_rev = r.reserved_rev.max(record.reserved_rev);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::epoch::{BoxFuture, FileEpochStore, StoreError};
    use palisade_api::EpochReason;

    fn state(dir: &std::path::Path, window: u64) -> Arc<EpochState> {
        let rec = EpochRecord::new(Epoch::ZERO, 7, EpochReason::Bootstrap, Revision::new(100));
        Arc::new(EpochState::new(
            Box::new(FileEpochStore::new(dir.join("e.json"))),
            window,
            Current {
                record: rec,
                etcd_mod_rev: 1,
                mismatch: None,
            },
        ))
    }

    #[tokio::test]
    async fn commit_is_durable_before_returning_and_checks_are_sticky() {
        let dir = tempfile::tempdir().unwrap();
        // Window 0: every grant past the record waits for its own (shared) write.
        let s = state(dir.path(), 0);
        let z = Epoch::ZERO;
        let (a, b) = tokio::join!(
            s.commit(z, Revision::new(105)),
            s.commit(z, Revision::new(103))
        );
        a.unwrap();
        b.unwrap();
        let on_disk = FileEpochStore::new(dir.path().join("e.json"))
            .load()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(on_disk.highest_grant_rev, Revision::new(105));
        assert_eq!(on_disk.reserved_rev, Revision::new(105));
        assert_eq!(s.high_water(), 105);
        assert!(s.check(None, 105, true).is_ok());
        // A grant that lands at the recorded revision again: the counter went back.
        let cur = s.snapshot();
        assert!(s.check_seen(&cur, 7, 105, 105, false).is_ok());
        assert!(s
            .check_seen(&cur, 7, 105, 105, true)
            .unwrap_err()
            .is_epoch_mismatch());
        // Sticky: even a fine header is refused now.
        assert!(s.check(None, 105, false).unwrap_err().is_epoch_mismatch());
    }

    /// Counts writes and takes a while for each, as an fsync does.
    struct SlowCountingStore {
        writes: std::sync::atomic::AtomicUsize,
        last: Mutex<Option<EpochRecord>>,
    }

    impl EpochStore for SlowCountingStore {
        fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>> {
            Box::pin(async { Ok(self.last.lock().unwrap().clone()) })
        }
        fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>> {
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                self.writes.fetch_add(1, Ordering::SeqCst);
                *self.last.lock().unwrap() = Some(record);
                Ok(())
            })
        }
    }

    #[tokio::test]
    async fn concurrent_grants_share_writes() {
        let store = std::sync::Arc::new(SlowCountingStore {
            writes: Default::default(),
            last: Mutex::new(None),
        });
        let rec = EpochRecord::new(Epoch::ZERO, 7, EpochReason::Bootstrap, Revision::new(100));
        let s = std::sync::Arc::new(EpochState::new(
            Box::new(store.clone()),
            0,
            Current {
                record: rec,
                etcd_mod_rev: 1,
                mismatch: None,
            },
        ));
        let commits = (101..=150).map(|r| {
            let s = s.clone();
            tokio::spawn(async move { s.commit(Epoch::ZERO, Revision::new(r)).await })
        });
        for c in commits.collect::<Vec<_>>() {
            c.await.unwrap().unwrap();
        }
        let writes = store.writes.load(Ordering::SeqCst);
        assert!(
            writes <= 3,
            "50 concurrent grants took {writes} durable writes"
        );
        assert_eq!(
            store
                .last
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .highest_grant_rev,
            Revision::new(150)
        );
    }

    #[tokio::test]
    async fn other_cluster_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path(), 0);
        let e = s.check_seen(&s.snapshot(), 8, 500, 100, false).unwrap_err();
        assert!(matches!(
            e.kind(),
            ErrorKind::EpochMismatch(EpochMismatch::ClusterId {
                recorded: 7,
                actual: 8
            })
        ));
    }

    #[tokio::test]
    async fn a_window_makes_grants_inside_it_cost_no_write_and_each_is_covered() {
        let store = std::sync::Arc::new(SlowCountingStore {
            writes: Default::default(),
            last: Mutex::new(None),
        });
        let rec = EpochRecord::new(Epoch::ZERO, 7, EpochReason::Bootstrap, Revision::new(100));
        let s = Arc::new(EpochState::new(
            Box::new(store.clone()),
            100,
            Current {
                record: rec,
                etcd_mod_rev: 1,
                mismatch: None,
            },
        ));
        for g in 101..=1100u64 {
            s.commit(Epoch::ZERO, Revision::new(g)).await.unwrap();
            let durable = store.last.lock().unwrap().clone().unwrap();
            assert!(
                durable.reserved_rev.get() >= g,
                "token for {g} handed out above the durable reservation {:?}",
                durable.reserved_rev
            );
            assert!(durable.highest_grant_rev.get() <= g);
        }
        // Each write raises the reservation by at least half the window.
        let writes = store.writes.load(Ordering::SeqCst);
        assert!(
            (10..=21).contains(&writes),
            "1000 grants took {writes} writes"
        );
        // A grant of another epoch (replaced meanwhile) is refused, not covered.
        let mut next = s.snapshot();
        next.record.epoch = Epoch::new(1).unwrap();
        s.replace(next);
        let e = s
            .commit(Epoch::ZERO, Revision::new(1101))
            .await
            .unwrap_err();
        assert!(matches!(
            e.kind(),
            ErrorKind::EpochMismatch(EpochMismatch::Advanced)
        ));
    }
}
