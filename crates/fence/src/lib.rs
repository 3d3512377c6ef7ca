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
//! # Features
//!
//! None yet; the token type is always available.

mod token;

pub use token::{Epoch, FencingToken, ParseTokenError, Revision, TokenRangeError};
