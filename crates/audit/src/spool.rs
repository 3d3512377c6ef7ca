//! The local spool: an append-only JSON-lines file of write events not yet in Postgres.
//!
//! Each append is one `write` of whole lines followed by `fdatasync`, so a batch is on
//! disk before the sink counts it spooled. A crash can leave a torn last line: reading
//! skips it (and counts it), and the next append starts on a fresh line. The file is
//! emptied only after every line in it is in Postgres; replaying it after a partial
//! drain duplicates nothing, as rows are keyed by their id.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use crate::{AuditError, WriteRecord};

/// The spool file. Only the sink's worker touches it (one writer).
#[derive(Debug, Clone)]
pub(crate) struct Spool {
    path: PathBuf,
}

/// What a read found.
#[derive(Debug, Default)]
pub(crate) struct SpoolContents {
    pub(crate) records: Vec<WriteRecord>,
    /// Lines that did not parse (a torn last line after a crash).
    pub(crate) skipped: usize,
}

impl Spool {
    pub(crate) fn new(path: PathBuf) -> Self {
        Spool { path }
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn error(&self, source: io::Error) -> AuditError {
        AuditError::Spool {
            path: self.path.clone(),
            source,
        }
    }

    /// Appends the records as JSON lines and syncs the file.
    pub(crate) fn append(&self, records: &[WriteRecord]) -> Result<(), AuditError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(records.len() * 256);
        for r in records {
            serde_json::to_writer(&mut buf, r).map_err(|e| self.error(e.into()))?;
            buf.push(b'\n');
        }
        self.append_bytes(&buf).map_err(|e| self.error(e))
    }

    fn append_bytes(&self, buf: &[u8]) -> io::Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&self.path)?;
        let len = file.metadata()?.len();
        if len > 0 {
            // A torn last line must not swallow the first line of this batch.
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
            }
        }
        file.write_all(buf)?;
        file.sync_data()
    }

    /// True when the file is absent or empty.
    pub(crate) fn is_empty(&self) -> Result<bool, AuditError> {
        match fs::metadata(&self.path) {
            Ok(m) => Ok(m.len() == 0),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(self.error(e)),
        }
    }

    /// Every record in the file, in order.
    pub(crate) fn read(&self) -> Result<SpoolContents, AuditError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(SpoolContents::default()),
            Err(e) => return Err(self.error(e)),
        };
        let mut contents = SpoolContents::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str(line) {
                Ok(r) => contents.records.push(r),
                Err(_) => contents.skipped += 1,
            }
        }
        Ok(contents)
    }

    /// Empties the file (after its records are in Postgres) and syncs it.
    pub(crate) fn clear(&self) -> Result<(), AuditError> {
        match OpenOptions::new().write(true).open(&self.path) {
            Ok(file) => file
                .set_len(0)
                .and_then(|()| file.sync_data())
                .map_err(|e| self.error(e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::{Finding, Outcome};

    fn record(resource: &str) -> WriteRecord {
        WriteRecord::new(
            "svc",
            resource,
            "PUT",
            Outcome::Unprotected,
            Finding::MissingToken,
            SystemTime::now(),
        )
    }

    #[test]
    fn appends_read_back_in_order_and_a_torn_line_is_skipped_not_glued() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path().join("sub/spool.jsonl"));
        assert!(spool.is_empty().unwrap());
        let a = vec![record("/a"), record("/b")];
        spool.append(&a).unwrap();
        // A crash in the middle of a line.
        let mut f = OpenOptions::new().append(true).open(spool.path()).unwrap();
        f.write_all(b"{\"id\":\"0190").unwrap();
        drop(f);
        let b = vec![record("/c")];
        spool.append(&b).unwrap();
        let read = spool.read().unwrap();
        assert_eq!(read.skipped, 1);
        let resources: Vec<_> = read
            .records
            .iter()
            .map(|r| r.resource.clone().unwrap())
            .collect();
        assert_eq!(resources, ["/a", "/b", "/c"]);
        assert_eq!(read.records[0], a[0], "a record round-trips exactly");
        spool.clear().unwrap();
        assert!(spool.is_empty().unwrap());
        assert!(spool.read().unwrap().records.is_empty());
    }
}
