//! palisade-lock on real etcd members that the test harness starts, one module per
//! concept; the set-up the modules share is in `support`.
//!
//! Every test that starts etcd members has `etcd` in its full name (its own name or its
//! module's): the `test(/etcd/)` filter in `.config/nextest.toml` runs those one at a time,
//! because members started side by side compete for the same cores and disk, and these
//! tests bound how long grants, expiries and lock delays take.

mod bad_input;
mod cancellation;
mod epoch_store;
mod epochs;
mod grant_records;
mod lease_loss;
mod leaseless;
mod lock_delay;
#[cfg(feature = "postgres")]
mod postgres_epoch_store;
mod quorum_loss;
mod quota;
mod release_and_handover;
mod sessions;
mod shared_mode;
mod stray_keys;
mod support;
mod tiers;
mod tls;
mod tokens_and_fifo;
