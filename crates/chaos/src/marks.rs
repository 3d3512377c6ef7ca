//! Revision marks: while the run goes on, each tier's etcd revision read every
//! [`EVERY`] and recorded as [`Event::RevisionSeen`] with when the read was sent and
//! when it was answered. Revisions of one cluster order its own events; these entries
//! place them in real time, so that the checker can compare holds of one lock on two
//! clusters (`check`'s rule (i)).
//!
//! A mark names its tier's revision space. The home tier's space changes when the
//! restore fault replaces its cluster: the restore holds [`SpaceCell`] while it runs,
//! and a read that would straddle it is not made.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use tokio::sync::{mpsc, Mutex};

use crate::clock::RunClock;
use crate::history::{Entry, Event};
use crate::runner::RUNNER;

/// How often each tier's revision is read.
const EVERY: Duration = Duration::from_millis(250);
/// How long one read may take before it is given up.
const READ_LIMIT: Duration = Duration::from_secs(1);

/// A tier's current revision space; held by whatever replaces the tier's cluster.
pub(crate) type SpaceCell = Arc<Mutex<u32>>;

/// One tier to mark.
pub(crate) struct Marked {
    /// The tier, `None` for the home tier (as the history names it).
    pub(crate) tier: Option<String>,
    pub(crate) endpoints: Vec<String>,
    pub(crate) space: SpaceCell,
}

/// The task that reads the revisions; dropping it stops it (and lets go of its sender of
/// history entries, so the history's writer can finish, also when a run fails).
pub(crate) struct Marker(tokio::task::JoinHandle<()>);

impl Drop for Marker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads every tier's revision every [`EVERY`] until the [`Marker`] is dropped.
pub(crate) fn spawn(
    tiers: Vec<Marked>,
    root: String,
    clock: RunClock,
    entries: mpsc::UnboundedSender<Entry>,
) -> Marker {
    Marker(tokio::spawn(async move {
        let mut clients: Vec<Option<Client>> = tiers.iter().map(|_| None).collect();
        loop {
            for (t, client) in tiers.iter().zip(clients.iter_mut()) {
                // Skipped while the tier's cluster is being replaced.
                let Ok(space) = t.space.try_lock() else {
                    continue;
                };
                if client.is_none() {
                    *client = Client::connect(&t.endpoints, None).await.ok();
                }
                let Some(c) = client.as_mut() else { continue };
                let asked_ns = clock.at_ns();
                let read = c.get(
                    root.as_str(),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                );
                let Ok(Ok(resp)) = tokio::time::timeout(READ_LIMIT, read).await else {
                    continue;
                };
                let Some(header) = resp.header() else {
                    continue;
                };
                let _ = entries.send(Entry {
                    at_ns: clock.at_ns(),
                    worker: RUNNER,
                    event: Event::RevisionSeen {
                        tier: t.tier.clone(),
                        space: *space,
                        revision: header.revision(),
                        asked_ns,
                    },
                });
            }
            tokio::time::sleep(EVERY).await;
        }
    }))
}
