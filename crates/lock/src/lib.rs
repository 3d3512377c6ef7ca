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
//! - Uncontended exclusive acquire, one Txn: if `h/`, `q/` and `g/` are empty (etcd
//!   compares a create revision over an empty range as 0) and the epoch key is unchanged,
//!   put `h/x/<lease>` (on the lease) and `g/x/<lease>`; else put the waiter key and read
//!   queue, holds and grant records in the same Txn. Shared: the same with `h/x/`,
//!   `q/x/`, `g/x/`, and no leftover `h/s/<lease>` of its own.
//! - A waiter decides on queue, holds and grant records read at one revision. Exclusive:
//!   it waits for the waiter just ahead of it, else for one holder. Shared: for the
//!   exclusive waiter just ahead of it, else for one exclusive holder. For a waiter ahead
//!   it waits on that waiter's key and its lease's hold key, and wakes when both are
//!   gone, that is on the predecessor's release (or its giving up); for a holder, on its
//!   hold key. An exclusive waiter also wakes when its own hold key is put (a
//!   hand-over, below).
//!   The waiters of a locker on one lock share one watch on its hold and waiter keys,
//!   created by the first of them from etcd's current revision (a past start revision
//!   is served by etcd's 100 ms catch-up loop) and cancelled when the last leaves; it
//!   keeps its latest messages, so a waiter that joins it after its view was read
//!   misses nothing (else it reads its keys once). A waiter whose lock's watch passed
//!   nothing on for ten request timeouts reads its keys anyway, and a write found that
//!   way ends the watch, which the next waiter creates anew. These watches share four streams per
//!   locker (etcd multiplexes watches on a stream by watch id); when one fails, every
//!   waiter on it reads anew. No polling and no thundering herd: a release wakes one
//!   waiter.
//!   Woken, it sends its grant Txn at once (allowing no grant record at all); a grant
//!   Txn that fails reads the lock in its else branch, and the waiter decides again.
//!   These reads are keys only (which keys exist, and their revisions); a hold of the
//!   waiter's own session is read with its value, to tell a grant whose answer was lost
//!   (adopted) from an earlier acquire's leftover (released). Every read and Txn answer
//!   is checked against the epoch (see `# Epochs`), and the wait's watch messages raise
//!   the locker's high water, so a waiter that sat in a watch still knows how far etcd
//!   had moved.
//! - When nothing blocks it, it grants itself in one Txn that compares its own waiter
//!   key's create revision (a waiter whose lease expired lost its key and can never be
//!   granted; a put on a dead lease also fails the Txn), the epoch key, no grant record
//!   changed since the read, and: exclusive, no holds and every waiter created at or after
//!   its own; shared, no exclusive hold and every exclusive waiter created after its own.
//!   Then it deletes its waiter key and puts the hold and grant record. Only a
//!   *succeeded* grant Txn's header revision is a grant revision (on the else branch it
//!   is just the current revision).
//! - Hand-over at release: an exclusive holder granted on the contended path read the
//!   oldest waiter of the lock (with its value) in its grant Txn. If that waiter is
//!   exclusive and of the holder's epoch, the release Txn also grants it, in a nested
//!   Txn that compares the waiter key's create revision (it still waits; any waiter
//!   created since is younger) and the epoch key: it deletes the waiter key and puts its
//!   hold key (on its lease) and grant record, with the waiter's stored meta. One write
//!   per hand-over instead of two in series; the release's revision is the new grant
//!   revision. The waiter sees its hold key's put (newer than the state it waited on),
//!   confirms it with a read checked against the epoch (its hold key as handed over, the
//!   epoch key unchanged), which also reads whom it hands over to in turn. That read is
//!   serializable (no read index through the leader): it decides on a past write, so it
//!   is taken from a member that applied the hand-over and every revision the locker has
//!   seen, and sent again linearizable when a lagging member answers. If the nested
//!   compares fail, the release is a plain one and the waiter grants itself.
//! - Lock-delay: if grant records of ended holds are found (expiry or force), the waiter
//!   grants no sooner than `lock_delay` after it first observed them. That instant is
//!   after the hold actually ended, so the delay is measured conservatively.
//! - A wait that times out or whose future is dropped deletes its waiter key, and a
//!   hold whose grant it never saw (inline on error, from a spawned task on drop); the
//!   deletes compare the value with the attempt's meta. If a key-creating Txn of the
//!   attempt may still be in flight, the same cleanup Txn writes the cancel marker (see
//!   the key layout). A waiter's grant Txn needs no marker: it compares its own waiter
//!   key's create revision, and the cleanup deleted that key.
//!
//! # Epochs
//!
//! `token = epoch · 2^48 + grant_rev`. The current epoch and the etcd cluster id that
//! serves it are recorded twice: in etcd (`config/epoch`) and in a durable record
//! outside etcd ([`EpochStore`]; [`FileEpochStore`] writes a JSON file atomically with
//! fsync and rename). The durable record also holds two revisions of the epoch:
//! `highest_grant_rev`, the *confirmed* revision (tokens up to it are known to have
//! been handed out), and `reserved_rev`, the *reservation* (no token above it has been
//! handed out). A store write is a max-merge: it never lowers the epoch, nor either
//! revision within an epoch, even with concurrent writers ([`FileEpochStore`]
//! serializes writers of one path with an exclusive `flock` on `<path>.lock` and uses a
//! unique temporary file per write). A record written before `reserved_rev` existed
//! loads with the reservation equal to the confirmed revision.
//!
//! Every locker (process, replica) serving one key space must share one durable record:
//! a locker whose own store is empty while etcd has an epoch refuses every grant
//! ([`EpochMismatch::Records`]), which is the safe answer for a store that lost its
//! record. Replicas share a `PostgresEpochStore` (feature `postgres`; one row per root
//! prefix in the `lock_epoch` table, created by its idempotent migrations; every write is
//! one atomic `INSERT ... ON CONFLICT ... DO UPDATE` max-merge). [`FileEpochStore`] is
//! for a single process (or processes of one host sharing the file).
//!
//! - The first locker on an empty key space and an empty store writes epoch 0 (reason
//!   `bootstrap`), durable record first.
//! - **The reservation** (as timestamp oracles persist an upper bound ahead of use): a
//!   token is handed out only for a grant revision at or below a reservation that is
//!   already durable. A grant inside it costs no durable write. Once less than half the
//!   window W ([`LockerOptions::with_epoch_window`], default [`DEFAULT_EPOCH_WINDOW`]
//!   revisions) is left above the highest revision the locker has granted at or seen,
//!   a background write raises the reservation to that revision + W and confirms the
//!   highest grant revision; a grant above the reservation waits for such a write
//!   (grants waiting at the same time share one). Every etcd write uses up a revision,
//!   so the record is written about once per W/2 etcd revisions.
//! - **Start** (and adopting an epoch another locker advanced): with `confirmed` and
//!   `reserved` from the durable record and etcd's revision `E`: if `E < confirmed`,
//!   etcd went back below tokens known to be handed out, a restore: grants are refused
//!   ([`EpochMismatch::RevisionBehind`]). If `confirmed <= E < reserved`, tokens up to
//!   `reserved` may have been handed out without being confirmed (by a locker that
//!   crashed, or by running lockers sharing the record), and etcd may or may not have
//!   been restored: before its first grant the locker writes to a key of its own
//!   (`epoch-bump`, 16 writes in flight) until etcd's revision is at least `reserved`,
//!   so every grant after it is above every token handed out. Its first grant then
//!   raises the reservation (one durable write). The cost of W at start-up is
//!   therefore up to W small etcd writes whenever a locker starts while etcd is inside
//!   the reservation, which is the usual case after a busy locker restarts (a locker
//!   that has not granted yet reserves nothing, so lockers starting side by side do
//!   not pay it): 0.6–1.2 s for 1,024 writes, one or three members, on a two-core
//!   machine at load average 16 (the writes are CPU-bound in etcd).
//! - Which restores are detected and which are made harmless. Detected: etcd's cluster
//!   id differs from the record's ([`EpochMismatch::ClusterId`]); etcd's revision is
//!   below the confirmed revision at start; a running locker sees a revision below one
//!   it granted at or saw in a response earlier (every checked response is a
//!   linearizable Txn, so this holds between grants too), or a grant at or below it.
//!   Made harmless, not reported: a restore, with the same cluster id, to a revision at
//!   or above the confirmed revision that a locker meets at start; the confirmed
//!   revision lags the tokens by up to about W revisions, so this is a restore to a
//!   snapshot less than about W revisions old. Grants after it are above the
//!   reservation, and so above every token of the epoch.
//! - Grants are refused with [`ErrorKind::EpochMismatch`] in the detected cases above;
//!   when the two records disagree or one is missing; or when the epoch key changed
//!   under a running locker. A grant Txn that succeeded in such a cluster is undone before
//!   the error is returned. The refusal is sticky until [`Locker::advance_epoch`], with
//!   one exception: a refusing locker (whatever the reason), and a running locker that
//!   sees the epoch key change, re-reads both records on its next acquire and, if they
//!   agree on a higher epoch naming the cluster that answered (and etcd is not below
//!   the recorded confirmed revision), adopts it (moving etcd past its reservation
//!   first, as at start) and grants under it; the acquire that noticed is retried under
//!   the new epoch. So a replica that saw a restored cluster resumes once the epoch was
//!   advanced through any replica. This needs the shared durable record above.
//! - Advancing (an operator action, reason `restore` or `rehome`) picks
//!   `max(epoch in etcd, durable epoch, this locker's epoch) + 1`, records the cluster id
//!   and revision it sees, and writes the durable record first, then etcd's: a crash in
//!   between only makes the next advance skip a number, so a new epoch is always above
//!   every epoch used. At [`Epoch::MAX`] (2^15 - 1) advancing is refused with
//!   [`ErrorKind::EpochExhausted`]: tokens would no longer fit below 2^63, and the
//!   namespace has to be retired.
//! - Not detectable: a restore from an older snapshot with the same cluster id after
//!   which etcd passed the recorded revisions before any locker looked (grants after it
//!   are above every token handed out, but the restored lock state may let two holders
//!   in; the resource's fence refuses the older token). Running lockers only compare
//!   etcd with what they saw themselves, not with tokens other lockers sharing the
//!   record handed out since. Operators advance the epoch on every restore.
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
