//! Epochs: the record of which etcd cluster (and how far into its revisions) the current
//! epoch is served by, kept in etcd *and* in a durable store outside it.
//!
//! The policy is in the crate docs (# Epochs).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::ResponseHeader;
use palisade_fence::{Epoch, Revision};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{EpochMismatch, Error, ErrorKind, Result};

/// A boxed, sendable future, as returned by [`EpochStore`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error type of an [`EpochStore`].
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// Why an epoch was started.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpochReason {
    /// The first epoch of an empty key space.
    Bootstrap,
    /// etcd was restored from a snapshot.
    Restore,
    /// The namespace moved to another etcd cluster.
    Rehome,
}

/// One epoch record, as stored in etcd (`config/epoch`) and in the durable store.
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch.
    #[cfg_attr(feature = "service", schema(value_type = u16))]
    pub epoch: Epoch,
    /// The etcd cluster id serving it (from response headers).
    pub cluster_id: u64,
    /// When it started, milliseconds since the Unix epoch.
    pub advanced_at_ms: u64,
    /// Why it started.
    pub reason: EpochReason,
    /// The highest grant revision issued in this epoch (durable store only; etcd's copy
    /// carries the revision etcd was at when the epoch started).
    #[cfg_attr(feature = "service", schema(value_type = u64))]
    pub highest_grant_rev: Revision,
}

impl EpochRecord {
    pub(crate) fn new(
        epoch: Epoch,
        cluster_id: u64,
        reason: EpochReason,
        revision: Revision,
    ) -> Self {
        let advanced_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        EpochRecord {
            epoch,
            cluster_id,
            advanced_at_ms,
            reason,
            highest_grant_rev: revision,
        }
    }
}

/// The durable record outside etcd. A file now ([`FileEpochStore`]); Postgres later.
///
/// `store` must be durable when its future completes.
pub trait EpochStore: Send + Sync + 'static {
    /// Loads the record, or `None` if none was ever stored.
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>>;
    /// Merges `record` into the stored one durably, never lowering it: a record with a
    /// higher epoch replaces it, a lower epoch changes nothing, and within one epoch
    /// `highest_grant_rev` only rises. Concurrent writers (other lockers sharing the
    /// store) must not be able to lower it either.
    fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>>;
}

impl<T: EpochStore> EpochStore for std::sync::Arc<T> {
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>> {
        (**self).load()
    }
    fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        (**self).store(record)
    }
}

/// An [`EpochStore`] in one JSON file, for a single locker process (or several lockers
/// of one host sharing the file). Each write takes an exclusive `flock` on `<path>.lock`,
/// reads the record, max-merges the new one into it (see [`EpochStore::store`]), and
/// replaces it atomically: a uniquely named temporary file beside it, fsync, rename over
/// the record, fsync of the directory. Unix only.
#[derive(Debug, Clone)]
pub struct FileEpochStore {
    path: PathBuf,
}

impl FileEpochStore {
    /// A store at `path` (the file need not exist yet; its directory must).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileEpochStore { path: path.into() }
    }
}

impl EpochStore for FileEpochStore {
    fn load(&self) -> BoxFuture<'_, Result<Option<EpochRecord>, StoreError>> {
        let path = self.path.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e.into()),
            })
            .await?
        })
    }

    fn store(&self, record: EpochRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = self.path.clone();
        Box::pin(
            async move { tokio::task::spawn_blocking(move || store_file(&path, record)).await? },
        )
    }
}

/// Numbers temporary files within the process (with the process id: unique per host).
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The max-merge of a stored record and a new one: a higher epoch replaces the record; a
/// lower epoch changes nothing; the same epoch keeps the higher `highest_grant_rev`.
pub(crate) fn merge(stored: Option<EpochRecord>, new: EpochRecord) -> EpochRecord {
    match stored {
        Some(old) if old.epoch > new.epoch => old,
        Some(old) if old.epoch == new.epoch => EpochRecord {
            highest_grant_rev: old.highest_grant_rev.max(new.highest_grant_rev),
            ..new
        },
        _ => new,
    }
}

fn store_file(path: &std::path::Path, record: EpochRecord) -> Result<(), StoreError> {
    use std::io::Write;
    // Writers of one path (in this process or others) take turns on a lock file beside
    // it; the record itself is replaced by rename, so it cannot carry the lock.
    let mut lock_name = path.as_os_str().to_owned();
    lock_name.push(".lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_name)?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
    let stored = match std::fs::read(path) {
        Ok(bytes) => Some(serde_json::from_slice::<EpochRecord>(&bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let record = merge(stored.clone(), record);
    if stored.as_ref() == Some(&record) {
        return Ok(()); // already durable
    }
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = PathBuf::from(tmp_name);
    let written = (|| -> Result<(), StoreError> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(&record)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        };
        std::fs::File::open(dir)?.sync_all()?;
    }
    // The lock is released when `lock` is closed.
    drop(lock);
    Ok(())
}

/// The locker's view of the current epoch, the checks on every response header, and
/// the group commit of the highest grant revision.
pub(crate) struct EpochState {
    store: Box<dyn EpochStore>,
    current: Mutex<Current>,
    /// Highest grant revision seen to succeed (durable or about to be).
    pending: AtomicU64,
    durable_tx: watch::Sender<u64>,
    flush: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) record: EpochRecord,
    /// mod_revision of `config/epoch` in etcd for this record; grants compare it.
    pub(crate) etcd_mod_rev: i64,
    pub(crate) mismatch: Option<EpochMismatch>,
}

impl EpochState {
    pub(crate) fn new(store: Box<dyn EpochStore>, current: Current) -> Self {
        let hw = current.record.highest_grant_rev.get();
        EpochState {
            store,
            current: Mutex::new(current),
            pending: AtomicU64::new(hw),
            durable_tx: watch::channel(hw).0,
            flush: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn store(&self) -> &dyn EpochStore {
        &*self.store
    }

    pub(crate) fn snapshot(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn replace(&self, current: Current) {
        let hw = current.record.highest_grant_rev.get();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = current;
        self.pending.store(hw, Ordering::SeqCst);
        self.durable_tx.send_replace(hw);
    }

    fn poison(&self, why: EpochMismatch) -> Error {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        Error::epoch(cur.mismatch.get_or_insert(why).clone())
    }

    /// The highest revision recorded so far; capture it before sending a request and
    /// pass it to [`EpochState::check`] with the response.
    pub(crate) fn high_water(&self) -> u64 {
        self.pending.load(Ordering::SeqCst)
    }

    /// Refuses if the epoch is poisoned, or the header names another cluster, or its
    /// revision is behind `hw_at_send` (for a grant: not above it, since a grant sent
    /// after a revision was recorded must commit after it).
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
            Some(h) => self.check_seen(&cur, h.cluster_id(), h.revision(), hw_at_send, is_grant),
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

    /// Marks the epoch key as changed elsewhere.
    pub(crate) fn advanced_elsewhere(&self) -> Error {
        self.poison(EpochMismatch::Advanced)
    }

    /// Returns once a durable record at or above `grant_rev` exists. Concurrent callers
    /// share writes: whoever flushes writes the highest revision pending at that moment.
    pub(crate) async fn commit(&self, grant_rev: Revision) -> Result<()> {
        let g = grant_rev.get();
        self.pending.fetch_max(g, Ordering::SeqCst);
        loop {
            if *self.durable_tx.borrow() >= g {
                return Ok(());
            }
            let _flusher = self.flush.lock().await;
            if *self.durable_tx.borrow() >= g {
                return Ok(());
            }
            let target = self.pending.load(Ordering::SeqCst);
            let mut record = self.snapshot().record;
            record.highest_grant_rev = Revision::new(target);
            self.store
                .store(record)
                .await
                .map_err(|e| Error::with_source(ErrorKind::EpochStore, e))?;
            self.durable_tx.send_modify(|d| *d = (*d).max(target));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_store_round_trips_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileEpochStore::new(dir.path().join("epoch.json"));
        assert_eq!(store.load().await.unwrap(), None);
        let mut r = EpochRecord::new(
            Epoch::new(3).unwrap(),
            0xabc,
            EpochReason::Restore,
            Revision::new(9),
        );
        store.store(r.clone()).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(r.clone()));
        r.highest_grant_rev = Revision::new(10);
        store.store(r.clone()).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(r.clone()));
        // Never lowered: an older revision of the epoch, or an older epoch, is ignored.
        let mut lower = r.clone();
        lower.highest_grant_rev = Revision::new(5);
        store.store(lower.clone()).await.unwrap();
        lower.epoch = Epoch::new(2).unwrap();
        lower.highest_grant_rev = Revision::new(50);
        store.store(lower).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(r));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[tokio::test]
    async fn file_store_concurrent_writers_keep_the_max() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("epoch.json");
        let (a, b) = (FileEpochStore::new(&path), FileEpochStore::new(&path));
        let rec =
            |rev| EpochRecord::new(Epoch::ZERO, 7, EpochReason::Bootstrap, Revision::new(rev));
        let writes = (1..=200u64).map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let r = rec(i);
            tokio::spawn(async move { store.store(r).await })
        });
        for w in writes.collect::<Vec<_>>() {
            w.await.unwrap().unwrap();
        }
        let stored = a.load().await.unwrap().unwrap();
        assert_eq!(stored.highest_grant_rev, Revision::new(200));
    }

    fn state(dir: &std::path::Path) -> EpochState {
        let rec = EpochRecord::new(Epoch::ZERO, 7, EpochReason::Bootstrap, Revision::new(100));
        EpochState::new(
            Box::new(FileEpochStore::new(dir.join("e.json"))),
            Current {
                record: rec,
                etcd_mod_rev: 1,
                mismatch: None,
            },
        )
    }

    #[tokio::test]
    async fn commit_is_durable_before_returning_and_checks_are_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path());
        let (a, b) = tokio::join!(s.commit(Revision::new(105)), s.commit(Revision::new(103)));
        a.unwrap();
        b.unwrap();
        let on_disk = FileEpochStore::new(dir.path().join("e.json"))
            .load()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(on_disk.highest_grant_rev, Revision::new(105));
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
            Current {
                record: rec,
                etcd_mod_rev: 1,
                mismatch: None,
            },
        ));
        let commits = (101..=150).map(|r| {
            let s = s.clone();
            tokio::spawn(async move { s.commit(Revision::new(r)).await })
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
        let s = state(dir.path());
        let e = s.check_seen(&s.snapshot(), 8, 500, 100, false).unwrap_err();
        assert!(matches!(
            e.kind(),
            ErrorKind::EpochMismatch(EpochMismatch::ClusterId {
                recorded: 7,
                actual: 8
            })
        ));
    }
}
