//! The Palisade lock core on etcd: sessions, fair exclusive/shared locks, fencing tokens
//! minted from the revision of the granting transaction, and epochs.
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
//! Everything lives under one root prefix (default `/palisade/`). The audit tailer reads
//! this layout; change it only together with the audit crate.
//!
//! | key | value | lease | written by |
//! |---|---|---|---|
//! | `config/ns/<ns>` | [`Namespace`] JSON | none | [`ConfigStore::put_namespace`] |
//! | `config/class/<ns>/<class>` | [`LockClass`] JSON (durations in ms) | none | [`ConfigStore::put_class`] |
//! | `config/epoch` | [`EpochRecord`] JSON | none | bootstrap, [`Locker::advance_epoch`] |
//! | `epoch-bump` | empty | none | a starting locker moving etcd's revision past the epoch reservation (see [Epochs](#epochs)) |
//! | `sessions/<lease>` | [`SessionRecord`] JSON | session | [`Locker::open_detached_session`] |
//! | `quota/<ns>/<lease>/<m>/<class>/<esc-key>` | empty | session | the service, per hold or wait (`held_lease_quota`) |
//! | `quota/<ns>/<lease>/session` | empty | session | the service, per session opened with the namespace (`held_lease_quota`) |
//! | `locks/<ns>/<class>/<k>/q/<x\|s>/<lease>` | holder meta | session | a waiter |
//! | `locks/<ns>/<class>/<k>/h/<x\|s>/<lease>` | holder meta | session | a grant |
//! | `locks/<ns>/<class>/<k>/g/<x\|s>/<lease>` | holder meta | none | a grant (grant record) |
//! | `locks/<ns>/<class>/<k>/c/<lease>/<attempt>` | empty | session | cleanup of a dropped acquire (cancel marker) |
//!
//! - `<k>` is the lock key with `%`, `/` and space percent-encoded (`%25`, `%2F`,
//!   `%20`), so it is one segment, and the `/` after it keeps `a/b` and `a/bc` apart.
//!   `<lease>` is the lease id as 16 lower-case hex digits. Names are
//!   `[a-z0-9][a-z0-9_-]{0,62}`. Lock keys are non-empty, at most [`MAX_KEY_LEN`] bytes,
//!   with no control character and no `..` segment.
//! - Holder meta is JSON `{"spiffe_id", "class", "mode", "epoch", "attempt"}` (`attempt`
//!   numbers the acquire that wrote it), plus `"holder_meta"`: the caller's
//!   [`HolderMeta`] object (at most [`MAX_HOLDER_META_LEN`] bytes), only if it gave one. The hold's token is
//!   `epoch · 2^48 + create_revision` of its `h/` key, which equals the revision of the
//!   granting Txn.
//! - Queue order is the create revision of the `q/` keys (FIFO).
//! - Compares and reads of `q/`, `h/` and `g/` cover only the lease-key ranges
//!   `<sub>/<x|s>/0000000000000000` ..= `<sub>/<x|s>/ffffffffffffffff`, so a stray key
//!   of another shape under a lock (say `q/x/junk`) never blocks it. A stray key inside
//!   those ranges but not written by this crate (say `q/x/1`) is treated like the key it
//!   resembles and can block the lock until deleted by hand; [`Locker::lock_state`]
//!   lists such keys in [`LockState::foreign_keys`].
//! - A cancel marker `c/<lease>/<attempt>` (`<attempt>` in decimal) is neither a grant
//!   nor a release: no `h/` or `g/` key changes in its revision except the deletes of the
//!   same attempt's own keys (which, if any, look like a release). Every Txn of an
//!   acquire that creates keys without comparing a key of its own (the first
//!   grant-or-enqueue Txn, a re-enqueue) is wrapped as `if create_revision(marker) == 0
//!   then <Txn>`. A dropped or failed acquire whose such Txn may still reach etcd (no
//!   answer, or sent more than once) puts the marker on the session's lease in the same
//!   Txn that deletes its keys, so a copy that etcd applies later does nothing. Markers
//!   are rare and end with the lease.
//!
//! ## How audit tells the events apart (all in one revision each)
//!
//! - **grant**: `h/<m>/<lease>` and `g/<m>/<lease>` created (and, for a waiter, its
//!   `q/` key deleted, and orphaned grant records of other leases deleted) in one
//!   revision.
//! - **release**: `h/<m>/<lease>` and `g/<m>/<lease>` deleted in one revision. A release
//!   that could not commit at the time (quorum lost) is finished later, in the same
//!   shape, by a background retry or by the session's next acquire of the lock. A
//!   release that hands the lock over (see the granting rules) is a release and a grant
//!   in one revision: one lease's `h/` and `g/` deleted, the next one's created, and its
//!   `q/` key deleted.
//! - **expiry**: `h/<m>/<lease>` deleted (with the lease's other keys) while
//!   `g/<m>/<lease>` stays: an orphaned grant record. The next grant of the lock deletes
//!   it, after the class's lock-delay.
//! - **force** ([`Locker::force_release`]): `h/<m>/<lease>` deleted and `g/<m>/<lease>`
//!   rewritten to `{"forced": <ForceMarker>}` in one revision; it also leaves an orphaned
//!   grant record, so lock-delay applies as after an expiry.
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
//! - `core` (default): the lock core on etcd ([`Locker`] and everything it returns).
//!   Needs etcd-client (and so protoc at build time).
//! - `service`: [`service`], the HTTP/JSON lock service (axum) with its authorization
//!   config and identities.
//! - `tls` (implies `service`): mTLS with rustls; callers are the SPIFFE IDs of their
//!   client certificates.
//! - `client`: `client`, a Rust client of the lock service over mTLS (rustls, `ring`)
//!   or, for dev mode, plain HTTP. Without `core` (`--no-default-features --features
//!   client`) the build has no etcd-client, tonic or protoc; only the shared data types
//!   ([`Mode`], [`LeaseId`], [`FencingToken`], [`Error`]...) come along.
//! - `postgres`: `PostgresEpochStore`, the durable epoch record in PostgreSQL, shared
//!   by several lockers.

#![cfg_attr(not(feature = "core"), allow(dead_code))]

#[cfg(feature = "core")]
mod acquire;
#[cfg(feature = "core")]
mod class_cache;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "core")]
mod config_store;
#[cfg(feature = "core")]
mod detached;
#[cfg(feature = "core")]
mod epoch;
mod error;
#[cfg(feature = "core")]
mod force;
#[cfg(feature = "core")]
mod handover;
#[cfg(feature = "core")]
mod hold;
#[cfg(feature = "core")]
mod inner;
#[cfg(feature = "core")]
mod inspect;
mod keys;
#[cfg(feature = "core")]
mod lock_watch;
#[cfg(feature = "core")]
mod locker;
mod meta;
mod model;
#[cfg(feature = "core")]
mod name;
#[cfg(feature = "core")]
mod retry;
#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "core")]
mod session;
#[cfg(feature = "core")]
mod watches;

#[cfg(feature = "core")]
pub use config_store::ConfigStore;
#[cfg(feature = "core")]
pub use detached::SessionRecord;
#[cfg(feature = "core")]
pub use epoch::{
    BoxFuture, EpochReason, EpochRecord, EpochStore, FileEpochStore, StoreError,
    DEFAULT_EPOCH_WINDOW, MAX_EPOCH_WINDOW,
};
#[cfg(feature = "postgres")]
pub use epoch::{PostgresEpochStore, MIGRATION as EPOCH_MIGRATION};
pub use error::{EpochMismatch, Error, ErrorKind, InvalidInput, Result};
#[cfg(feature = "core")]
pub use force::ForceMarker;
#[cfg(feature = "core")]
pub use hold::Hold;
#[cfg(feature = "core")]
pub use inspect::{Holder, LockState, Waiter};
pub use keys::MAX_KEY_LEN;
#[cfg(feature = "core")]
pub use locker::{Locker, LockerOptions, DEFAULT_ROOT};
pub use meta::{HolderMeta, MAX_HOLDER_META_LEN};
pub use model::{Enforcement, LeaseId, LockClass, Mode, Namespace, QuorumPolicy, SpiffeId};
#[cfg(feature = "core")]
pub use name::LockName;
pub use palisade_fence::{Epoch, FencingToken, Revision};
#[cfg(feature = "core")]
pub use session::{LossReason, Session};
