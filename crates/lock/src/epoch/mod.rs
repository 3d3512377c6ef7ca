//! Epochs: the record of which etcd cluster (and how far into its revisions) the current
//! epoch is served by, kept in etcd *and* in a durable store outside it.
//!
//! The policy is in the crate docs (# Epochs).

mod file;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
mod state;

pub use file::FileEpochStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresEpochStore, MIGRATION};
pub use record::{BoxFuture, EpochReason, EpochRecord, EpochStore, StoreError};
pub(crate) use state::{move_revision_to, Current, EpochState};
pub use state::{DEFAULT_EPOCH_WINDOW, MAX_EPOCH_WINDOW};
