//! Write events, and a bounded, non-blocking observer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use http::Method;
use tokio::sync::mpsc;

use super::policy::Enforcement;
use crate::FencingToken;

/// What the layer found about one checked write.
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

/// One checked write, reported once the layer decided (before the inner service runs, or
/// instead of it when refused).
///
/// Writes to advisory resources are always reported; writes to fenced resources (admitted
/// and refused) only with [`FenceLayer::with_fenced_events`](crate::FenceLayer::with_fenced_events).
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
    /// True when the write went through without a current token: an advisory resource
    /// and any `outcome` but `Admitted`.
    pub unprotected: bool,
    /// True when the layer refused the write: a fenced resource and any `outcome` but
    /// `Admitted`.
    pub rejected: bool,
    /// The resource's enforcement.
    pub enforcement: Enforcement,
    /// When the layer decided (wall clock).
    pub at: SystemTime,
    /// The caller's identity (for example a SPIFFE ID), when the layer has a
    /// [`with_caller`](crate::FenceLayer::with_caller) extractor and it found one.
    pub caller: Option<String>,
}

impl WriteEvent {
    pub(crate) fn new(
        resource: String,
        method: Method,
        token: Option<FencingToken>,
        highest: Option<FencingToken>,
        outcome: WriteOutcome,
        enforcement: Enforcement,
        caller: Option<String>,
    ) -> Self {
        let current = outcome == WriteOutcome::Admitted;
        WriteEvent {
            resource,
            method,
            token,
            highest,
            outcome,
            unprotected: !current && enforcement == Enforcement::Advisory,
            rejected: !current && enforcement == Enforcement::Fenced,
            enforcement,
            at: SystemTime::now(),
            caller,
        }
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
        (
            ChannelObserver {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
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
