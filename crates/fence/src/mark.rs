//! A resource's mark as a durable store keeps it, and the record of a reset that lowered
//! one: the shapes every durable store's admin helpers read and write (Postgres, Redis,
//! MariaDB), and `palisade fence show/reset` prints.

use std::time::SystemTime;

use crate::FencingToken;

/// A resource's high-water mark as a durable store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mark {
    /// The highest token admitted (or the token a reset set).
    pub token: FencingToken,
    /// When the mark was last raised or reset.
    pub updated_at: SystemTime,
}

/// One entry of a store's reset log (`fence_reset_log` in SQL): a mark lowered by a reset
/// (for Postgres, [`reset_mark`](crate::postgres::reset_mark)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MarkReset {
    /// The mark before.
    pub old: FencingToken,
    /// The mark after.
    pub new: FencingToken,
    /// Why, as given.
    pub reason: String,
    /// Who ran it, as the store itself recorded it: the database role that logged in
    /// (Postgres `session_user`, MariaDB `USER()`); for Redis, the connection's ACL user as
    /// the resetting client read it (`ACL WHOAMI`: a Redis function cannot read it, see
    /// `palisade_fence::redis::reset_mark_guarded`).
    pub reset_by: String,
    /// When.
    pub reset_at: SystemTime,
    /// The lock that guards the resource, as the resetter named it, and the reset's floor
    /// (the lowest mark it could set: the lock's newest grant); `None` for a reset made
    /// with the lock unknown ([`ResetGuard::LockUnknown`]).
    pub lock: Option<(String, FencingToken)>,
}

/// What a reset was checked against, recorded with it in the store's reset log (and by
/// `palisade fence reset` in the audit trail).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetGuard {
    /// The lock that guards the resource (`NAMESPACE/CLASS/KEY`) and the reset's floor,
    /// read from the lock service: its newest holder's token, or with no holder the lowest
    /// token it can grant next. `fence_reset` refuses a new mark below `floor`: it would
    /// admit the lock's earlier holders again.
    Lock {
        /// The lock's name.
        name: String,
        /// The lowest mark the reset may set.
        floor: FencingToken,
    },
    /// No lock is known to guard the resource: nothing bounds the new mark from below but
    /// the caller's care, and the log says so (its lock columns are `NULL`).
    LockUnknown,
}

impl ResetGuard {
    /// [`ResetGuard::Lock`].
    pub fn lock(name: impl Into<String>, floor: FencingToken) -> Self {
        ResetGuard::Lock {
            name: name.into(),
            floor,
        }
    }
}
