//! The etcd key layout under the root prefix: the one definition, used by the lock core
//! that writes it and by the audit tailer and the chaos checker that read it.
//!
//! Everything lives under one root prefix (default `/palisade/`). [`RootKeys`] and
//! [`LockKeys`] build the keys; [`RootKeys::parse_lock_entry`] reads a key under `locks/`
//! back; [`HoldValue`] and [`ForcedGrant`] are the values.
//!
//! | key | value | lease | written by |
//! |---|---|---|---|
//! | `config/ns/<ns>` | [`Namespace`](crate::Namespace) JSON | none | the lock core's `ConfigStore::put_namespace` |
//! | `config/class/<ns>/<class>` | [`LockClass`](crate::LockClass) JSON (durations in ms) | none | `ConfigStore::put_class` |
//! | `config/epoch` | `EpochRecord` JSON | none | bootstrap, `Locker::advance_epoch` |
//! | `tier/fence/<ns>` | empty | none | a rehome: while it exists the cluster grants nothing in `<ns>` (every acquire's first Txn compares it absent) |
//! | `tier/rehome/<ns>` | [`RehomeRecord`](crate::RehomeRecord) JSON | none | a rehome in progress, on the home tier only |
//! | `epoch-bump` | empty | none | a starting locker moving etcd's revision past the epoch reservation (the lock core's epoch rules) |
//! | `leases/<lease>` | empty | session | the lock core's session open (lease marker) |
//! | `sessions/<lease>` | `SessionRecord` JSON | session | `Locker::open_detached_session` |
//! | `sessions/<lease>/forced/<grant_rev>` | [`ForcedNotice`] JSON | session | a force release of that session's hold (`Locker::force_release_grant`) |
//! | `owners/<esc-spiffe-id>/<lease>` | empty | session | `Locker::open_detached_session`, per open session of an identity (the service's per-identity limit) |
//! | `quota/<ns>/slot/<i>` | `<lease>/<m>/<class>/<esc-key>#<take>` (a hold or wait) or `<lease>/session#<take>` | session | the service: slot `i` (10 digits, below `held_lease_quota`) taken in the acquire's first Txn, or by a session opened with the namespace |
//! | `locks/<ns>/<class>/<k>/q/<x\|s>/<lease>` | holder meta | session | a waiter |
//! | `locks/<ns>/<class>/<k>/h/<x\|s>/<lease>` | holder meta | session | a grant |
//! | `locks/<ns>/<class>/<k>/g/<x\|s>/<lease>` | holder meta | none | a grant whose meta says `grant_record` (grant record), or a force release |
//! | `locks/<ns>/<class>/<k>/c/<lease>/<request>` | empty | session | cleanup of a dropped acquire (cancel marker) |
//!
//! - `<k>` is the lock key with `%`, `/` and space percent-encoded (`%25`, `%2F`,
//!   `%20`), so it is one segment, and the `/` after it keeps `a/b` and `a/bc` apart.
//!   `<lease>` is the lease id as 16 lower-case hex digits. Names are
//!   `[a-z0-9][a-z0-9_-]{0,62}`. Lock keys are non-empty, at most [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes,
//!   with no control character and no `..` segment.
//! - Holder meta is JSON `{"spiffe_id", "class", "mode", "epoch", "attempt", "request"}`
//!   (`attempt` names the acquire that wrote it, the same for its retries:
//!   [`AttemptId`](crate::AttemptId); `request` is random per request, so a retry that
//!   takes the key over writes a value of its own), plus `"holder_meta"`: the caller's
//!   [`HolderMeta`](crate::HolderMeta) object (at most
//!   [`MAX_HOLDER_META_LEN`](crate::MAX_HOLDER_META_LEN) bytes), only if it gave one. The hold's token is
//!   `epoch · 2^48 + create_revision` of its `h/` key, which equals the revision of the
//!   granting Txn.
//! - Queue order is the create revision of the `q/` keys (FIFO).
//! - Compares and reads of `q/`, `h/` and `g/` cover only the lease-key ranges
//!   `<sub>/<x|s>/0000000000000000` ..= `<sub>/<x|s>/ffffffffffffffff`, so a stray key
//!   of another shape under a lock (say `q/x/junk`) never blocks it. A stray key inside
//!   those ranges but not written by this crate (say `q/x/1`) is treated like the key it
//!   resembles in the compares.
//! - Only keys whose lease is alive count ([`LockKeys::is_live_entry`],
//!   [`is_live_slot`]): a `q/` or `h/` key, a cancel marker, or a quota slot is someone's
//!   only while etcd keeps it on the session lease its name gives (a slot: on a lease). One with no lease (a copy by `etcdctl make-mirror`, which drops leases) or on
//!   another lease is never a holder, a waiter or a taken slot: an acquire that meets one
//!   under its lock deletes it (it can never end by itself, and it would fail the
//!   grant's range compares), a slot take overwrites one, a rehome deletes those of the
//!   namespace on its target tier, and the lock core's `Locker::lock_state` lists those
//!   it sees in `LockState::foreign_keys`, with their lease. Grant records (`g/`) have no
//!   lease by design and are not concerned.
//! - A cancel marker `c/<lease>/<request>` (`<request>` in decimal) is neither a grant
//!   nor a release: no `h/` or `g/` key changes in its revision except the deletes of the
//!   same request's own keys (which, if any, look like a release). Every Txn of an
//!   acquire that creates keys without comparing a key of its own (the first
//!   grant-or-enqueue Txn, a re-enqueue) is wrapped as `if create_revision(marker) == 0
//!   then <Txn>`. A dropped or failed acquire whose such Txn may still reach etcd (no
//!   answer, or sent more than once) puts the marker on the session's lease in the same
//!   Txn that deletes its keys, so a copy that etcd applies later does nothing; a
//!   granted one puts it before handing out the hold (deleting, in the same Txn, a
//!   waiter key of its own that a copy wrote). Markers are rare and end with the lease.
//!
//! # Which grants write a grant record
//!
//! A grant record outlives an expired or forced hold, so that the next grant waits the
//! class's lock-delay after it. A grant writes one only where that is needed: for a
//! class with a non-zero lock-delay, and for a session whose lease carries no marker
//! (a detached session is marked by its record `sessions/<lease>`; a session the lock
//! core opens puts `leases/<lease>` when it opens). Its holder meta says which
//! (`grant_record`, absent meaning yes). A class whose lock-delay is raised applies it
//! to holds granted after the change.
//!
//! # How audit tells the events apart (all in one revision each)
//!
//! The rule is [`HoldEnd::classify`], which the audit tailer and the chaos checker
//! both call.
//!
//! - **grant**: `h/<m>/<lease>` created (with `g/<m>/<lease>` where the grant writes a
//!   record; for a waiter, its `q/` key deleted; orphaned grant records of other
//!   leases deleted) in one revision.
//! - **release**: `h/<m>/<lease>` deleted, with `g/<m>/<lease>` if the hold had one,
//!   while the lease's marker stays. A release that could not commit at the time
//!   (quorum lost) is finished later, in the same shape, by a background retry or by
//!   the session's next acquire of the lock. A release that hands the lock over (see
//!   the granting rules) is a release and a grant in one revision: one lease's hold
//!   (and record) deleted, the next one's created, and its `q/` key deleted.
//! - **expiry**: `h/<m>/<lease>` deleted with the lease's other keys, its marker among
//!   them, when the lease expires or is revoked; a grant record, if the hold had one,
//!   stays as an orphan, and the next grant of the lock deletes it after the class's
//!   lock-delay.
//! - **force** (`Locker::force_release`): `h/<m>/<lease>` deleted and `g/<m>/<lease>`
//!   put (or rewritten) as `{"forced": <ForceMarker>}` ([`ForcedGrant`]) in one
//!   revision; it leaves an orphaned grant record, so lock-delay applies as after an
//!   expiry.

mod ends;
mod layout;
mod live;
mod parse;
mod values;

pub use ends::{HoldEnd, RecordChange};
pub use layout::{escape_key, prefix_end, LockKeys, RootKeys, DEFAULT_ROOT};
pub use live::is_live_slot;
pub use parse::{unescape_key, LockEntry, LockEntryKey};
pub use values::{ForceMarker, ForcedGrant, ForcedNotice, HoldValue};
