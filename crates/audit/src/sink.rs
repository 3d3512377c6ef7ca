//! The write-event sink: a bounded, non-blocking [`WriteObserver`] that batches events
//! into Postgres, and spools them to a local file while Postgres is unavailable.
//!
//! - **On the request path** [`SinkObserver::observe`] builds the row (id, labels) and
//!   `try_send`s it on a bounded queue; it never awaits. A full queue drops the event and
//!   counts it; the count is stored as a row of its own (`outcome = 'dropped'`,
//!   `dropped = n`) with the next batch.
//! - **A worker task** collects up to `batch_size` rows, or what arrived within
//!   `flush_interval`, and inserts them in one statement. If the insert fails (or a
//!   database call takes longer than `db_timeout`), the batch is appended to the spool file and synced, and
//!   the database is left alone for `retry_interval`; later batches go to the spool too.
//!   Once an insert is tried again, the spool is replayed first and then emptied. Rows are
//!   keyed by their id, so a replay after a partial failure duplicates nothing.
//! - **[`AuditSink::shutdown`]** flushes everything queued, to Postgres or else to the
//!   spool, and returns the counters. Dropping the sink without it does the same in the
//!   background, if the runtime lives on.
//!
//! Losing the audit database never blocks a write (invariant 2): the worst a slow database
//! does is fill the queue, and then events are counted as dropped.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use palisade_fence::{WriteEvent, WriteObserver};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::spool::Spool;
use crate::store::insert_writes;
use crate::{AuditError, Labels, Outcome, WriteRecord};

type ClassifyFn = dyn Fn(&str) -> Labels + Send + Sync;

/// Rows per insert statement when replaying the spool.
const DRAIN_CHUNK: usize = 1_000;

/// Counters of a sink, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkStats {
    /// Rows inserted straight from a batch (including `dropped` rows).
    pub inserted: u64,
    /// Rows appended to the spool file.
    pub spooled: u64,
    /// Rows replayed from the spool into Postgres (duplicates of stored rows included).
    pub drained: u64,
    /// Events dropped because the queue was full (or the sink had stopped).
    pub dropped: u64,
    /// Rows that reached neither Postgres nor the spool (spool I/O failed); they are
    /// reported in a `dropped` row as well.
    pub lost: u64,
    /// Spool lines that did not parse and were skipped (a torn line after a crash).
    pub spool_skipped: u64,
}

#[derive(Default)]
struct Counters {
    inserted: AtomicU64,
    spooled: AtomicU64,
    drained: AtomicU64,
    dropped: AtomicU64,
    lost: AtomicU64,
    spool_skipped: AtomicU64,
    /// Dropped (or lost) events not yet reported in a `dropped` row.
    unreported: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> SinkStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SinkStats {
            inserted: get(&self.inserted),
            spooled: get(&self.spooled),
            drained: get(&self.drained),
            dropped: get(&self.dropped),
            lost: get(&self.lost),
            spool_skipped: get(&self.spool_skipped),
        }
    }
}

struct Shared {
    service: String,
    classify: Option<Arc<ClassifyFn>>,
    counters: Counters,
}

/// Configures an [`AuditSink`]; from [`AuditSink::builder`].
#[must_use]
pub struct SinkBuilder {
    service: String,
    spool: PathBuf,
    capacity: usize,
    batch_size: usize,
    flush_interval: Duration,
    retry_interval: Duration,
    db_timeout: Duration,
    classify: Option<Arc<ClassifyFn>>,
}

impl fmt::Debug for SinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkBuilder")
            .field("service", &self.service)
            .field("spool", &self.spool)
            .field("capacity", &self.capacity)
            .field("batch_size", &self.batch_size)
            .field("flush_interval", &self.flush_interval)
            .field("retry_interval", &self.retry_interval)
            .field("db_timeout", &self.db_timeout)
            .field(
                "classify",
                &self.classify.as_ref().map(|_| format_args!("<fn>")),
            )
            .finish()
    }
}

impl SinkBuilder {
    /// Queue room, in events (default 10,000). Events beyond it are dropped and counted.
    ///
    /// # Panics
    ///
    /// In [`start`](Self::start), if 0.
    pub fn capacity(mut self, events: usize) -> Self {
        self.capacity = events;
        self
    }

    /// Most rows per insert (default 500).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// Longest a row waits in a partial batch (default 200 ms).
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// How long after a failed insert the database is tried again (default 1 s);
    /// batches go to the spool meanwhile.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Longest one insert (or spool replay) may take before the batch is spooled instead
    /// (default 5 s).
    pub fn db_timeout(mut self, timeout: Duration) -> Self {
        self.db_timeout = timeout;
        self
    }

    /// Names each resource's lock namespace and class (called on the request path, so it
    /// must be quick; by default both are unknown).
    pub fn classify<F>(mut self, f: F) -> Self
    where
        F: Fn(&str) -> Labels + Send + Sync + 'static,
    {
        self.classify = Some(Arc::new(f));
        self
    }

    /// Starts the worker on the current tokio runtime. The database may be down: rows
    /// spool until it is back. A non-empty spool left by an earlier run is replayed first.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if the capacity is 0.
    pub fn start(self, pool: Pool) -> AuditSink {
        let (tx, rx) = mpsc::channel(self.capacity);
        let shared = Arc::new(Shared {
            service: self.service,
            classify: self.classify,
            counters: Counters::default(),
        });
        let (stop, stopped) = oneshot::channel();
        let spool = Spool::new(self.spool);
        let worker = Worker {
            pool,
            spool_pending: !spool.is_empty().unwrap_or(false),
            spool,
            shared: Arc::clone(&shared),
            batch_size: self.batch_size,
            flush_interval: self.flush_interval,
            retry_interval: self.retry_interval,
            db_timeout: self.db_timeout,
            retry_at: None,
        };
        let handle = tokio::spawn(worker.run(rx, stopped));
        AuditSink {
            observer: SinkObserver { tx, shared },
            stop,
            worker: handle,
        }
    }
}

/// The write-event sink. See the [module docs](self) for the behaviour.
///
/// ```no_run
/// use palisade_audit::{pool, AuditSink, Labels};
/// use palisade_fence::{Enforcement, FenceLayer, MemoryStore};
///
/// # async fn example() -> Result<(), palisade_audit::AuditError> {
/// let pool = pool("host=127.0.0.1 user=postgres dbname=audit", 4)?;
/// palisade_audit::migrate(&pool).await?;
/// let sink = AuditSink::builder("orders-api", "/var/lib/orders/audit-spool.jsonl")
///     .classify(|resource| Labels::new("shop", if resource.starts_with("/orders/") { "orders" } else { "other" }))
///     .start(pool);
/// let layer = FenceLayer::new(MemoryStore::new(100_000))
///     .with_enforcement(|_| Enforcement::Advisory)
///     .with_fenced_events()
///     .with_observer(sink.observer());
/// // ... serve with the layer; on the way out:
/// let stats = sink.shutdown().await;
/// assert_eq!(stats.lost, 0);
/// # drop(layer); Ok(()) }
/// ```
pub struct AuditSink {
    observer: SinkObserver,
    stop: oneshot::Sender<()>,
    worker: JoinHandle<()>,
}

impl fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditSink")
            .field("service", &self.observer.shared.service)
            .finish_non_exhaustive()
    }
}

impl AuditSink {
    /// A sink for the service named `service` (stored in every row), spooling to the file
    /// at `spool` (created with its directory when first needed).
    pub fn builder(service: impl Into<String>, spool: impl Into<PathBuf>) -> SinkBuilder {
        SinkBuilder {
            service: service.into(),
            spool: spool.into(),
            capacity: 10_000,
            batch_size: 500,
            flush_interval: Duration::from_millis(200),
            retry_interval: Duration::from_secs(1),
            db_timeout: Duration::from_secs(5),
            classify: None,
        }
    }

    /// The observer to give to [`FenceLayer::with_observer`](palisade_fence::FenceLayer::with_observer)
    /// (cheap to clone).
    pub fn observer(&self) -> SinkObserver {
        self.observer.clone()
    }

    /// The counters so far.
    pub fn stats(&self) -> SinkStats {
        self.observer.shared.counters.snapshot()
    }

    /// Stops the worker after it has written every queued event (and a `dropped` row for
    /// what was dropped) to Postgres, or, if that fails, to the spool. Events observed
    /// after this are counted as dropped and not stored.
    ///
    /// # Panics
    ///
    /// If the worker panicked (the panic is resumed).
    pub async fn shutdown(self) -> SinkStats {
        let _ = self.stop.send(());
        if let Err(e) = self.worker.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        self.observer.shared.counters.snapshot()
    }
}

/// The [`WriteObserver`] side of an [`AuditSink`]: never blocks, never awaits.
#[derive(Clone)]
pub struct SinkObserver {
    tx: mpsc::Sender<WriteRecord>,
    shared: Arc<Shared>,
}

impl fmt::Debug for SinkObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkObserver")
            .field("service", &self.shared.service)
            .finish_non_exhaustive()
    }
}

impl SinkObserver {
    /// Events dropped so far because the queue was full or the sink had stopped (the
    /// [`SinkStats::dropped`] of its sink).
    pub fn dropped(&self) -> u64 {
        self.shared.counters.dropped.load(Ordering::Relaxed)
    }

    fn drop_one(&self) {
        let c = &self.shared.counters;
        c.dropped.fetch_add(1, Ordering::Relaxed);
        c.unreported.fetch_add(1, Ordering::Relaxed);
    }
}

impl WriteObserver for SinkObserver {
    fn observe(&self, event: WriteEvent) {
        if self.tx.capacity() == 0 {
            // Full (or closed): skip building the row.
            return self.drop_one();
        }
        let labels = self
            .shared
            .classify
            .as_ref()
            .map(|f| f(&event.resource))
            .unwrap_or_default();
        let record = WriteRecord::from_event(&self.shared.service, event, labels);
        if self.tx.try_send(record).is_err() {
            self.drop_one();
        }
    }
}

struct Worker {
    pool: Pool,
    spool: Spool,
    shared: Arc<Shared>,
    batch_size: usize,
    flush_interval: Duration,
    retry_interval: Duration,
    db_timeout: Duration,
    /// After a failed insert: when to try the database again.
    retry_at: Option<Instant>,
    /// The spool may hold rows (checked at start).
    spool_pending: bool,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<WriteRecord>, mut stop: oneshot::Receiver<()>) {
        let mut batch = Vec::with_capacity(self.batch_size);
        // The first tick one interval from now (not at once), so a batch is never cut
        // short by the worker's start.
        let mut tick =
            tokio::time::interval_at(Instant::now() + self.flush_interval, self.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                received = rx.recv() => match received {
                    Some(record) => {
                        batch.push(record);
                        if batch.len() >= self.batch_size {
                            self.flush(&mut batch, false).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => self.flush(&mut batch, false).await,
            }
        }
        rx.close();
        while let Ok(record) = rx.try_recv() {
            batch.push(record);
        }
        self.flush(&mut batch, true).await;
    }

    /// Writes the batch (plus a `dropped` row if events were dropped) to Postgres, after
    /// replaying the spool; or to the spool. On `last`, the database is tried even within
    /// the retry interval.
    async fn flush(&mut self, batch: &mut Vec<WriteRecord>, last: bool) {
        let unreported = self.shared.counters.unreported.swap(0, Ordering::Relaxed);
        if unreported > 0 {
            batch.push(WriteRecord::dropped(&self.shared.service, unreported));
        }
        if batch.is_empty() && !self.spool_pending {
            return;
        }
        let records = std::mem::take(batch);
        let due = self.retry_at.is_none_or(|at| Instant::now() >= at);
        if last || due {
            match self.write_database(&records).await {
                Ok(()) => {
                    self.retry_at = None;
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "audit database unavailable; spooling"),
            }
            self.retry_at = Some(Instant::now() + self.retry_interval);
        }
        self.write_spool(records).await;
    }

    /// Bounds one database call by `db_timeout`. Spool I/O is never under a timeout, so
    /// it is never left running behind the worker's back.
    async fn db<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, AuditError>>,
    ) -> Result<T, AuditError> {
        tokio::time::timeout(self.db_timeout, call)
            .await
            .unwrap_or(Err(AuditError::Timeout(self.db_timeout)))
    }

    async fn write_database(&mut self, records: &[WriteRecord]) -> Result<(), AuditError> {
        let client = self.db(async { Ok(self.pool.get().await?) }).await?;
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        if self.spool_pending {
            let spool = self.spool.clone();
            let contents = blocking(move || spool.read()).await?;
            for chunk in contents.records.chunks(DRAIN_CHUNK) {
                self.db(insert_writes(&**client, chunk)).await?;
            }
            let spool = self.spool.clone();
            blocking(move || spool.clear()).await?;
            self.spool_pending = false;
            counters
                .drained
                .fetch_add(contents.records.len() as u64, Ordering::Relaxed);
            counters
                .spool_skipped
                .fetch_add(contents.skipped as u64, Ordering::Relaxed);
            if !contents.records.is_empty() {
                tracing::info!(rows = contents.records.len(), "audit spool replayed");
            }
        }
        self.db(insert_writes(&**client, records)).await?;
        counters
            .inserted
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn write_spool(&mut self, records: Vec<WriteRecord>) {
        if records.is_empty() {
            return;
        }
        let n = records.len() as u64;
        let spool = self.spool.clone();
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        match tokio::task::spawn_blocking(move || spool.append(&records).map_err(|e| (e, records)))
            .await
        {
            Ok(Ok(())) => {
                self.spool_pending = true;
                counters.spooled.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Err((e, records))) => {
                tracing::error!(error = %e, rows = n, "audit spool write failed; events lost");
                // Report the loss in the next `dropped` row: the events themselves, and
                // the counts of any `dropped` rows among them.
                let lost: u64 = records
                    .iter()
                    .map(|r| {
                        if r.outcome == Outcome::Dropped {
                            r.dropped.unwrap_or(0)
                        } else {
                            1
                        }
                    })
                    .sum();
                counters.lost.fetch_add(lost, Ordering::Relaxed);
                counters.unreported.fetch_add(lost, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::error!(error = %e, rows = n, "audit spool task failed; events lost");
                counters.lost.fetch_add(n, Ordering::Relaxed);
                counters.unreported.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// Runs spool I/O off the async worker threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AuditError> + Send + 'static,
) -> Result<T, AuditError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
