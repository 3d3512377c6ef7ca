//! [`FileEpochStore`]: the durable epoch record in one JSON file.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::record::{merge, BoxFuture, EpochStore, StoreError};
use palisade_api::EpochRecord;

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

#[cfg(test)]
mod tests {
    use palisade_fence::{Epoch, Revision};

    use super::*;
    use palisade_api::EpochReason;

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
        r.reserved_rev = Revision::new(30);
        store.store(r.clone()).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(r.clone()));
        // Never lowered: an older revision of the epoch, or an older epoch, is ignored.
        let mut lower = r.clone();
        lower.highest_grant_rev = Revision::new(5);
        lower.reserved_rev = Revision::new(20);
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
}
