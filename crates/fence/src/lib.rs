//! Fencing tokens and the resource-side checks that give them meaning.
//!
//! A lease-based lock cannot stop a paused or partitioned holder from writing after its
//! lease expired; only the resource can, by refusing any write whose token is below the
//! highest it has already seen (its *high-water mark*). This crate is that resource side.
//! It never talks to etcd: a service that only verifies tokens builds without etcd-client,
//! tonic or protoc.
//!
//! # The token
//!
//! [`FencingToken`] is `epoch · 2^48 + grant_rev`, where `grant_rev` is the etcd revision
//! of the transaction that granted the hold and `epoch` (below 2^15) is advanced whenever
//! the revision counter could go backwards (etcd restored from a snapshot, or the lock
//! namespace rehomed to another etcd cluster). Tokens are therefore totally ordered and
//! strictly increase across grants, and always fit a signed 64-bit `BIGINT`.
//!
//! # The verifiers
//!
//! - [`HighWaterStore`]: an atomic compare-and-raise of a resource's mark;
//!   [`MemoryStore`] for one process, [`PostgresStore`], `RedisStore` and `MysqlStore`
//!   (features `redis`, `mysql`) shared by replicas.
//! - [`FenceLayer`]: a tower layer that refuses stale writes to an HTTP service
//!   (428/400/409 as `application/problem+json`), or only reports them (advisory mode).
//!   [`FencingTokenLayer`] is its client side.
//! - [`fenced_transaction`], [`FencedTransaction`], [`begin_fenced`], [`fenced_execute`],
//!   [`FencedUpdate`]: the token check and the
//!   write in one Postgres transaction, the only form that also orders the writes
//!   themselves (see [ordering](crate::fence#ordering-what-the-layer-guarantees-and-what-needs-the-postgres-helper)).
//!   The same on MySQL/MariaDB, and the fenced writes on Redis: the `mysql` and `redis`
//!   modules (features of the same names).
//!
//! Each concept has a public module with the full story ([`store`], [`fence`],
//! [`client`], [`postgres`]); the main items are also re-exported here.
//!
//! # Features
//!
//! | feature | default | gives |
//! |---|---|---|
//! | *(none)* | | [`FencingToken`] and its parts, [`HighWaterStore`] |
//! | `memory` | yes | [`MemoryStore`] (std only) |
//! | `tower` | yes | [`FenceLayer`], [`FencingTokenLayer`] (tower, http) |
//! | `metrics` | no | [`FenceMetrics`]: the layer's counters in Prometheus text format (prometheus; implies `tower`) |
//! | `postgres` | no | [`PostgresStore`], the conditional-write helper, `ToSql`/`FromSql` for tokens (tokio-postgres, moka) |
//! | `redis` | no | [`RedisStore`], the fence as a Redis Function library and the fenced writes ([`redis`]; redis-rs) |
//! | `mysql` | no | [`MysqlStore`], the fence's SQL API on MySQL/MariaDB (InnoDB) and the conditional-write helper ([`mysql`]; mysql_async) |

#[cfg(feature = "tower")]
pub mod client;
#[cfg(feature = "tower")]
pub mod fence;
pub mod mark;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod store;
mod token;

#[cfg(feature = "tower")]
pub use client::{FencingTokenLayer, SetFencingToken, TokenSource};
#[cfg(feature = "metrics")]
pub use fence::FenceMetrics;
#[cfg(feature = "tower")]
pub use fence::{
    decoded_path, ChannelObserver, Enforcement, EnforcementTable, Fence, FenceLayer, Rejection,
    RejectionKind, ResponseFuture, VerifiedToken, WriteEvent, WriteObserver, WriteOutcome,
    FENCING_TOKEN,
};
pub use mark::{Mark, MarkReset, ResetGuard};
#[cfg(feature = "postgres")]
pub use postgres::{
    begin_fenced, fenced_execute, fenced_transaction, migrate, read_mark, reset_mark, FenceError,
    FenceErrorKind, FencedStatement, FencedTransaction, FencedUpdate, PreparedFence,
    PreparedFencedUpdate, TxFuture, MIGRATION, SCHEMA,
};
#[cfg(feature = "memory")]
pub use store::MemoryStore;
#[cfg(feature = "mysql")]
pub use store::MysqlStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
#[cfg(feature = "postgres")]
pub use store::{BatchCounts, PostgresStore};
pub use store::{HighWaterStore, Raise, RaiseFuture, StoreError};
pub use token::{Epoch, FencingToken, ParseTokenError, Revision, TokenRangeError};
