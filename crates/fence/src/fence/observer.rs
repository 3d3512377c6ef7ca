//! Write events for advisory resources, and a bounded, non-blocking observer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::Method;
use tokio::sync::mpsc;

use crate::FencingToken;

/// What the layer found about one write to an advisory resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// The token was current; the mark was raised.
    Admitted,
    /// No `Fencing-Token` header.
    MissingToken,
    /// A header that is not one decimal token.
    MalformedToken,
    /// The token was below the resource's mark.
    Stale,
    /// The store could not answer, so the token was not checked.
    StoreUnavailable,
}

/// One write to an advisory resource, reported after the layer decided to let it through
/// and before the inner service runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteEvent {
    /// The resource key.
    pub resource: String,
    /// The request method.
    pub method: Method,
    /// The token, when the header held a well-formed one.
    pub token: Option<FencingToken>,
    /// The resource's mark, when the token was stale.
    pub highest: Option<FencingToken>,
    /// What the layer found.
    pub outcome: WriteOutcome,
    /// True unless the write carried a current token (`outcome` is `Admitted`).
    pub unprotected: bool,
}

impl WriteEvent {
    pub(crate) fn new(
        resource: String,
        method: Method,
        token: Option<FencingToken>,
        highest: Option<FencingToken>,
        outcome: WriteOutcome,
    ) -> Self {
        WriteEvent { resource, method, token, highest, outcome, unprotected: outcome != WriteOutcome::Admitted }
    }
}

/// Receives [`WriteEvent`]s from the layer, on the request path.
///
/// `observe` must not block or await anything: hand the event to a bounded queue and drop
/// it (counting the drop) when the queue is full. [`ChannelObserver`] does exactly that.
pub trait WriteObserver: Send + Sync + 'static {
    /// Takes one event. Must return promptly.
    fn observe(&self, event: WriteEvent);
}

impl<F: Fn(WriteEvent) + Send + Sync + 'static> WriteObserver for F {
    fn observe(&self, event: WriteEvent) {
        self(event)
    }
}

/// A [`WriteObserver`] that queues events on a bounded tokio channel and counts the
/// events it had to drop because the queue was full or the receiver gone.
#[derive(Debug, Clone)]
pub struct ChannelObserver {
    tx: mpsc::Sender<WriteEvent>,
    dropped: Arc<AtomicU64>,
}

impl ChannelObserver {
    /// An observer with room for `capacity` queued events, and the receiving end.
    ///
    /// # Panics
    ///
    /// If `capacity` is 0.
    pub fn bounded(capacity: usize) -> (Self, mpsc::Receiver<WriteEvent>) {
        let (tx, rx) = mpsc::channel(capacity);
        (ChannelObserver { tx, dropped: Arc::new(AtomicU64::new(0)) }, rx)
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl WriteObserver for ChannelObserver {
    fn observe(&self, event: WriteEvent) {
        if self.tx.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
