//! The Palisade lock core on etcd: sessions, fair exclusive/shared locks, fencing tokens
//! minted from the revision of the granting transaction, epochs, and the quota slots the
//! service counts. Everything that talks to etcd for a lock lives here.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade_lock::Error> {
//! use std::time::Duration;
//! use palisade_lock::{FileEpochStore, LockClass, LockName, Locker, LockerOptions, Mode, Namespace, SpiffeId};
//!
//! let locker = Locker::connect(LockerOptions::new(["http://127.0.0.1:2379"]), FileEpochStore::new("epoch.json")).await?;
//! locker.config().put_namespace(&Namespace::new("orders", "acme")).await?;
//! locker.config().put_class(&LockClass::new("orders", "rows", "")).await?;
//! let session = locker.open_session(SpiffeId::new("spiffe://acme/billing")?, Duration::from_secs(10)).await?;
//! let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
//! let hold = locker.acquire(&session, &LockName::new("orders", "rows", "order/42"), Mode::Exclusive, deadline).await?;
//! let token = hold.token().expect("fenced class");   // send as `Fencing-Token: <token>`
//! # let _ = token;
//! hold.release().await?;
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! # Key layout
//!
//! The keys and values under the root prefix are defined in [`palisade_api::keys`], the
//! one home of the layout, which the audit tailer and the chaos checker read too.
//!
//! # Granting rules
//!
//! The granting rules are in the module docs of `acquire` (`src/acquire/mod.rs`),
//! beside the code that keeps them.
//!
//! # Epochs
//!
//! The epoch rules are in the module docs of `epoch` (`src/epoch/mod.rs`), beside the
//! code that keeps them.
//!
//! # Quorum loss
//!
//! Requests carry etcd's require-leader metadata (a member without a leader fails them
//! at once with `Unavailable` instead of hanging) and a per-request timeout
//! ([`LockerOptions::with_request_timeout`]); transient failures are retried, which with
//! several endpoints also moves the request off a dead member. When the caller's deadline
//! passes while etcd still cannot commit, `closed` classes fail with
//! [`ErrorKind::QuorumLost`] and `open` classes return an unprotected [`Hold`] (no token,
//! nothing recorded in etcd) that callers and resources can tell apart. "Cannot commit"
//! means etcd was seen failing: an error, or no answer within a whole request timeout.
//! A deadline that cuts the only attempts short before that (shorter than one request
//! timeout, on a healthy cluster) is [`ErrorKind::DeadlineExceeded`], and grants nothing.
//!
//! # Known limits
//!
//! - A session's TTL is what etcd granted, which can exceed the TTL asked for (etcd's
//!   minimum lease TTL); class TTL bounds apply to the granted TTL, so a class whose
//!   `ttl_max` is below etcd's minimum refuses every session.
//! - A locker caches classes while a watch on `config/` tells it of every change (any
//!   namespace or class write clears its cache); while that watch is down it reads the
//!   class from etcd on every acquire. An acquire that read its class just before an
//!   update may still be granted under the old class.
//! - A release whose first attempt committed but whose answer was lost is retried and
//!   then reports [`ErrorKind::NotHeld`].
//! - A force release while the holder's session lives does not fire [`Hold::lost`]; the
//!   resource refuses the holder's token once a newer one has been used.
//!
//! # Features
//!
//! - `postgres`: `PostgresEpochStore`, the durable epoch record in PostgreSQL, shared
//!   by several lockers.
//!
//! The HTTP service is `palisade-server`; its Rust client, which builds without
//! etcd-client, is `palisade-client`; the wire types and key layout are `palisade-api`.

mod acquire;
mod class_cache;
mod config_store;
mod detached;
mod epoch;
mod error;
mod etcd_tls;
mod force;
mod handover;
mod hold;
mod inner;
mod inspect;
mod lock_watch;
mod locker;
mod name;
mod quota;
mod retry;
mod session;
mod session_cache;
mod stray;
mod tiers;
mod watches;

pub use acquire::AcquireAttempt;
pub use config_store::ConfigStore;
pub use detached::SessionRecord;
pub use epoch::{
    BoxFuture, EpochStore, FileEpochStore, StoreError, DEFAULT_EPOCH_WINDOW, MAX_EPOCH_WINDOW,
};
#[cfg(feature = "postgres")]
pub use epoch::{PostgresEpochStore, MIGRATION as EPOCH_MIGRATION};
pub use error::{EpochMismatch, Error, ErrorKind, Result};
pub use etcd_tls::{EtcdTls, EtcdTlsError, TlsPart};
pub use hold::Hold;
pub use inspect::{Holder, LockState, Waiter};
pub use locker::{Locker, LockerOptions, DEFAULT_ROOT};
pub use name::LockName;
pub use palisade_api::keys::ForceMarker;
pub use palisade_api::{
    Enforcement, Epoch, EpochReason, EpochRecord, FencingToken, HolderMeta, InvalidInput, LeaseId,
    LockClass, Mode, Namespace, QuorumPolicy, Revision, SpiffeId, MAX_HOLDER_META_LEN, MAX_KEY_LEN,
};
pub use session::{LossReason, Session};
pub use stray::ForeignKey;
pub use tiers::{RehomeOutcome, Tiers, DEFAULT_DRAIN, DEFAULT_TIER, MAX_DRAIN};
