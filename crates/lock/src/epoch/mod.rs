//! Epochs: the record of which etcd cluster (and how far into its revisions) the current
//! epoch is served by, kept in etcd *and* in a durable store outside it.
//!
//! The policy is in the crate docs (# Epochs).

mod file;
mod lifecycle;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
mod state;

pub use file::FileEpochStore;
pub(crate) use lifecycle::{adopt_advanced, advance, start};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresEpochStore, MIGRATION};
pub use record::{BoxFuture, EpochReason, EpochRecord, EpochStore, StoreError};
pub(crate) use state::EpochState;
pub use state::{DEFAULT_EPOCH_WINDOW, MAX_EPOCH_WINDOW};
