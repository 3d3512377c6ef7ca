//! Epochs: which etcd cluster serves the current epoch, and how far into its revisions
//! tokens have gone. Kept in etcd *and* in a durable store outside it.
//!
//! `token = epoch · 2^48 + grant_rev`. The current epoch and the etcd cluster id that
//! serves it are recorded twice: in etcd (`config/epoch`) and in a durable record
//! outside etcd ([`EpochStore`]; [`FileEpochStore`] writes a JSON file atomically with
//! fsync and rename). The durable record also holds two revisions of the epoch:
//! - `highest_grant_rev`, the *confirmed* revision: tokens up to it are known to have
//!   been handed out;
//! - `reserved_rev`, the *reservation*: no token above it has been handed out.
//!
//! A store write is a max-merge. It never lowers the epoch, nor either revision within
//! an epoch, even with concurrent writers. [`FileEpochStore`] serializes writers of one
//! path with an exclusive `flock` on `<path>.lock` and uses a unique temporary file per
//! write. A record without `reserved_rev` loads with the reservation equal to the
//! confirmed revision.
//!
//! Every locker (process, replica) serving one key space must share one durable record.
//! A locker whose own store is empty while etcd has an epoch refuses every grant
//! ([`EpochMismatch::Records`](crate::EpochMismatch::Records)): the safe answer for a
//! store that lost its record. Replicas share a `PostgresEpochStore` (feature
//! `postgres`): one row per root prefix in the `lock_epoch` table, created by its
//! idempotent migrations; every write is one atomic `INSERT ... ON CONFLICT ... DO
//! UPDATE` max-merge. [`FileEpochStore`] is for a single process, or processes of one
//! host sharing the file.
//!
//! - **Bootstrap.** The first locker on an empty key space and an empty store writes
//!   epoch 0 (reason `bootstrap`), durable record first.
//! - **The reservation** (as timestamp oracles persist an upper bound ahead of use). A
//!   token is handed out only for a grant revision at or below a reservation that is
//!   already durable. A grant inside it costs no durable write. Let W be the window
//!   ([`LockerOptions::with_epoch_window`](crate::LockerOptions::with_epoch_window),
//!   default [`DEFAULT_EPOCH_WINDOW`] revisions). Once less than W/2 is left above the
//!   highest revision the locker has granted at or seen, a background write raises the
//!   reservation to that revision + W and confirms the highest grant revision. A grant
//!   above the reservation waits for such a write; grants waiting at the same time
//!   share one. Every etcd write uses up a revision, so the record is written about
//!   once per W/2 etcd revisions.
//! - **Start** (and adopting an epoch another locker advanced). Take `confirmed` and
//!   `reserved` from the durable record and etcd's revision `E`.
//!   - `E < confirmed`: etcd went back below tokens known to be handed out, a restore.
//!     Grants are refused
//!     ([`EpochMismatch::RevisionBehind`](crate::EpochMismatch::RevisionBehind)).
//!   - `confirmed <= E < reserved`: tokens up to `reserved` may have been handed out
//!     without being confirmed (by a locker that crashed, or by running lockers sharing
//!     the record), and etcd may or may not have been restored. Before its first grant
//!     the locker writes to a key of its own (`epoch-bump`, 16 writes in flight) until
//!     etcd's revision is at least `reserved`. So every grant after it is above every
//!     token handed out. Its first grant then raises the reservation (one durable
//!     write).
//!
//!   So a start costs up to W small etcd writes whenever etcd is inside the
//!   reservation, the usual case after a busy locker restarts. A locker that has not
//!   granted yet reserves nothing, so lockers starting side by side do not pay it. The
//!   writes are CPU-bound in etcd.
//! - **Detected restores.** etcd's cluster id differs from the record's
//!   ([`EpochMismatch::ClusterId`](crate::EpochMismatch::ClusterId)). etcd's revision
//!   is below the confirmed revision at start. A running locker sees a revision below
//!   one it granted at or saw in a response earlier, or a grant at or below it. Every
//!   checked response is a linearizable Txn, so this holds between grants too.
//! - **Restores made harmless, not reported.** A restore, with the same cluster id, to
//!   a revision at or above the confirmed revision that a locker meets at start. The
//!   confirmed revision lags the tokens by up to about W revisions, so this is a
//!   restore to a snapshot less than about W revisions old. Grants after it are above
//!   the reservation, and so above every token of the epoch.
//! - **Refusal.** Grants are refused with
//!   [`ErrorKind::EpochMismatch`](crate::ErrorKind::EpochMismatch) in the detected cases
//!   above; when the two records disagree or one is missing; or when the epoch key
//!   changed under a running locker. A grant Txn that succeeded in such a cluster is
//!   undone before the error is returned. The refusal is sticky until
//!   [`Locker::advance_epoch`](crate::Locker::advance_epoch), with one exception:
//!   adoption.
//! - **Adoption.** A refusing locker (whatever the reason), and a running locker that
//!   sees the epoch key change, re-reads both records on its next acquire. It adopts
//!   the epoch if they agree on a higher epoch naming the cluster that answered, and
//!   etcd is not below the recorded confirmed revision. It first moves etcd past the
//!   reservation, as at start, then grants under the new epoch. The acquire that
//!   noticed is retried under it. So a replica that saw a restored cluster resumes once
//!   the epoch was advanced through any replica. This needs the shared durable record.
//! - **Advancing** (an operator action, reason `restore` or `rehome`) picks
//!   `max(epoch in etcd, durable epoch, this locker's epoch) + 1` and records the
//!   cluster id and revision it sees. It writes the durable record first, then etcd's:
//!   a crash in between only makes the next advance skip a number, so a new epoch is
//!   always above every epoch used. At [`Epoch::MAX`](crate::Epoch::MAX) (2^15 - 1)
//!   advancing is refused with
//!   [`ErrorKind::EpochExhausted`](crate::ErrorKind::EpochExhausted): tokens would no
//!   longer fit below 2^63, and the namespace has to be retired.
//! - **Not detectable.** A restore from an older snapshot with the same cluster id,
//!   after which etcd passed the recorded revisions before any locker looked. Grants
//!   after it are above every token handed out, but the restored lock state may let two
//!   holders in; the resource's fence refuses the older token. Running lockers only
//!   compare etcd with what they saw themselves, not with tokens other lockers sharing
//!   the record handed out since. Operators advance the epoch on every restore.
//! - **Restores that raise the revision** (etcd 3.5's `etcdutl snapshot restore
//!   --bump-revision N --mark-compacted`, N at least the revisions written since the
//!   snapshot) serve no revision twice, so they are not detected either, and need not
//!   be for the tokens: every grant after one is above every token handed out, in the
//!   same epoch. A watch from a revision of the lost history fails as compacted. The
//!   restored lock state is still older than what holders were told, which is what the
//!   epoch advance the operator makes afterwards settles.
//! - **Waiters a restore brought back** (`q/` keys of live sessions whose acquires ended
//!   in the lost history) would block their locks for as long as their sessions live.
//!   Advancing for a restore deletes every waiter key older than the advance; an
//!   acquire still waiting enqueues again. Holds brought back stay (see `restored.rs`).
//!
//! Where each rule lives: `record.rs` (the record, the store trait, the max-merge),
//! `file.rs` and `postgres.rs` (the stores), `state.rs` (the running checks and the
//! reservation), `lifecycle.rs` (bootstrap, start, adoption, advancing, moving etcd's
//! revision past a reservation), `restored.rs` (the waiters a restore brought back).

mod file;
mod lifecycle;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
mod restored;
mod state;

pub use file::FileEpochStore;
pub(crate) use lifecycle::{adopt_advanced, advance, start};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresEpochStore, MIGRATION};
pub use record::{BoxFuture, EpochStore, StoreError};
pub(crate) use state::EpochState;
pub use state::{DEFAULT_EPOCH_WINDOW, MAX_EPOCH_WINDOW};
