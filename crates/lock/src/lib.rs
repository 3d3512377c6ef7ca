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
//! | `locks/<ns>/<class>/<k>/q/<x\|s>/<lease>` | holder meta | session | a waiter |
//! | `locks/<ns>/<class>/<k>/h/<x\|s>/<lease>` | holder meta | session | a grant |
//! | `locks/<ns>/<class>/<k>/g/<x\|s>/<lease>` | holder meta | none | a grant (grant record) |
//!
//! - `<k>` is the lock key with `%`, `/` and space percent-encoded (`%25`, `%2F`,
//!   `%20`), so it is one segment, and the `/` after it keeps `a/b` and `a/bc` apart.
//!   `<lease>` is the lease id as 16 lower-case hex digits. Names are
//!   `[a-z0-9][a-z0-9_-]{0,62}`. Lock keys are non-empty, at most [`MAX_KEY_LEN`] bytes,
//!   with no control character and no `..` segment.
//! - Holder meta is JSON `{"spiffe_id", "class", "mode", "epoch"}`. The hold's token is
//!   `epoch · 2^48 + create_revision` of its `h/` key, which equals the revision of the
//!   granting Txn.
//! - Queue order is the create revision of the `q/` keys (FIFO).
//!
//! ## How audit tells the events apart (all in one revision each)
//!
//! - **grant**: `h/<m>/<lease>` and `g/<m>/<lease>` created (and, for a waiter, its
//!   `q/` key deleted) in one revision.
//! - **release**: `h/<m>/<lease>` and `g/<m>/<lease>` deleted in one revision.
//! - **expiry**: `h/<m>/<lease>` deleted (with the lease's other keys) while
//!   `g/<m>/<lease>` stays: an orphaned grant record. The next grant of the lock deletes
//!   it, after the class's lock-delay.
//! - **force** ([`Locker::force_release`]): `h/<m>/<lease>` deleted and `g/<m>/<lease>`
//!   rewritten to `{"forced": <ForceMarker>}` in one revision; it also leaves an orphaned
//!   grant record, so lock-delay applies as after an expiry.
//!
//! # Granting rules
//!
//! - Uncontended exclusive acquire, one Txn: if `h/`, `q/` and `g/` are empty (etcd
//!   compares a create revision over an empty range as 0) and the epoch key is unchanged,
//!   put `h/x/<lease>` (on the lease) and `g/x/<lease>`; else put the waiter key. Shared:
//!   the same with `h/x/`, `q/x/`, `g/x/`.
//! - A waiter reads queue, holds and grant records at one revision. Exclusive: it waits
//!   for the waiter just ahead of it, else for one holder. Shared: for the exclusive
//!   waiter just ahead of it, else for one exclusive holder. It watches that one key from
//!   the read's revision + 1 until it is deleted, then reads again: no polling and no
//!   thundering herd.
//! - When nothing blocks it, it grants itself in one Txn that compares its own waiter
//!   key's create revision (a waiter whose lease expired lost its key and can never be
//!   granted; a put on a dead lease also fails the Txn), the epoch key, no grant record
//!   changed since the read, and: exclusive, no holds and every waiter created at or after
//!   its own; shared, no exclusive hold and every exclusive waiter created after its own.
//!   Then it deletes its waiter key and puts the hold and grant record. Only a
//!   *succeeded* grant Txn's header revision is a grant revision (on the else branch it
//!   is just the current revision).
//! - Lock-delay: if grant records of ended holds are found (expiry or force), the waiter
//!   grants no sooner than `lock_delay` after it first observed them. That instant is
//!   after the hold actually ended, so the delay is measured conservatively.
//! - A wait that times out or whose future is dropped deletes its waiter key (inline on
//!   error, from a spawned task on drop).
//!
//! # Epochs and quorum loss
//!
//! See [`epoch`](crate::EpochRecord) policy in the `epoch` module docs, summarized: grants
//! are refused with [`ErrorKind::EpochMismatch`] when etcd's cluster id or revision does
//! not match the records until an operator calls [`Locker::advance_epoch`]; a token is
//! handed out only after the durable record holds a revision at or above its own.
//! Requests carry etcd's require-leader metadata and a per-request timeout and are
//! retried on transient failures until the caller's deadline; then `closed` classes
//! fail with [`ErrorKind::QuorumLost`] and `open` classes return an unprotected [`Hold`].
//!
//! # Features
//!
//! None.

mod acquire;
mod config_store;
mod epoch;
mod error;
mod force;
mod hold;
mod keys;
mod locker;
mod model;
mod retry;
mod session;

pub use config_store::ConfigStore;
pub use epoch::{BoxFuture, EpochReason, EpochRecord, EpochStore, FileEpochStore, StoreError};
pub use error::{EpochMismatch, Error, ErrorKind, InvalidInput, Result};
pub use force::ForceMarker;
pub use hold::Hold;
pub use keys::MAX_KEY_LEN;
pub use locker::{LockName, Locker, LockerOptions, DEFAULT_ROOT};
pub use model::{Enforcement, LeaseId, LockClass, Mode, Namespace, QuorumPolicy, SpiffeId};
pub use palisade_fence::{Epoch, FencingToken, Revision};
pub use session::{LossReason, Session};
