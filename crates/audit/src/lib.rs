//! Palisade audit: what happened to locks, and which writes reached a resource without a
//! current fencing token.
//!
//! - **Schema**: [`migrate`] applies the migrations shipped with the crate ([`MIGRATIONS`]),
//!   idempotently, under an advisory lock. Tables: `audit_event` (grants, releases,
//!   expiries, forced releases and compaction gaps, keyed by `(cluster_id, revision, seq)`),
//!   `force_release` (who, who approved, why), `write_event` (one row per checked write),
//!   `write_event_hourly` (unprotected writes per hour, kept by triggers with the rows),
//!   `write_event_daily`, `write_event_daily_resource` and `write_event_hourly_finding`
//!   (the overview's counts per day, per day and resource, per hour and finding; kept
//!   the same way),
//!   `audit_cursor` (how far the tailer has read each etcd cluster's history),
//!   `audit_history` (a digest per revision read, to recognise restored history),
//!   `fence_reset` (resets of a resource's high-water mark, [`insert_fence_reset`]),
//!   `epoch_event` (epoch advances, [`EpochAdvance`]) and `rehome_event` (rehome
//!   switches, [`RehomeSwitch`]).
//! - **Write events**: [`AuditSink`] is a bounded, non-blocking
//!   [`WriteObserver`](palisade_fence::WriteObserver) for the fence layer. It batches rows
//!   into Postgres and spools them to a local file while Postgres is down; see [`sink`].
//!   [`CallerIdentity`] names the caller (mTLS peer, or a trusted proxy's XFCC header).
//! - **Lock events**: [`Tailer`] watches the lock core's key space in etcd and stores
//!   grants, releases, expiries and forced releases (and compaction gaps) as they appear in
//!   etcd history, and each epoch advance (reason `bootstrap`, `restore` or `rehome`) and
//!   rehome switch, with its position in `audit_cursor` ([`tailer_position`]); see
//!   [`tailer`]. [`insert_lock_events`] and [`insert_force_release`] store rows
//!   idempotently (the service records each forced release's who and why).
//! - **Dashboard**: [`dashboard::router`] serves an overview, unprotected and refused writes (filters, pages, CSV,
//!   an hourly SVG chart), a lock's timeline (with the gaps and epoch advances that cut it),
//!   and the forced releases, as HTML and as JSON
//!   under `/api/`.
//!
//! Audit only observes: a slow or absent audit database never blocks a write or a grant
//! (the tailer falls behind and catches up from etcd history).

pub mod dashboard;
mod epoch;
mod error;
mod event;
mod identity;
mod lock;
mod pool;
mod restored;
mod schema;
pub mod sink;
mod spool;
mod store;
pub mod tailer;

pub use epoch::{
    epoch_advances, insert_epoch_advances, insert_rehome_switches, reason_str, EpochAdvance,
    RehomeSwitch,
};
pub use error::AuditError;
pub use event::{Finding, Labels, Outcome, WriteRecord};
pub use identity::{CallerIdentity, PeerSpiffeId, XFCC};
pub use lock::{ClusterId, FenceReset, ForceRelease, LockEvent, LockEventKind};
pub use pool::{pool, POOL_TIMEOUT};
pub use schema::{is_current, migrate, migrate_client, MIGRATIONS};
pub use sink::{AuditSink, SinkBuilder, SinkObserver, SinkStats};
pub use store::{insert_fence_reset, insert_force_release, insert_lock_events, insert_writes};
pub use tailer::{tailer_position, Tailer};
