//! The wire contract of Palisade, shared by the lock core, the service, its clients, the
//! CLI, the audit tailer and the chaos checker. Defined here once; everything else
//! imports it. No etcd client and no HTTP server: a worker that builds `palisade-client`
//! builds this and nothing of the server.
//!
//! | module | what |
//! |---|---|
//! | [`keys`] | the etcd key layout under the root prefix, its parser and its values |
//! | [`routes`] | every route's path, and builders for concrete paths |
//! | [`wire`] | the JSON request and response bodies of the service |
//! | [`problem`] | problem kinds: slugs, `type` URIs and status codes |
//! | [`limits`] | the bounds of session TTLs and of a class's TTLs and lock-delay; the etcd keepalive |
//! | crate root | names and keys ([`validate_name`], [`validate_key`]), free text ([`validate_text`]) and query strings ([`validate_query_utf8`]), ids ([`LeaseId`], [`SpiffeId`]), configuration records ([`Namespace`], [`LockClass`], [`EpochRecord`], [`RehomeRecord`]), [`TieredSessionId`], [`HolderMeta`], and [`InvalidInput`], why input was refused |
//!
//! # Features
//!
//! - `openapi`: `utoipa::ToSchema` on the bodies, for the server's OpenAPI document.

mod config;
mod epoch;
mod holder_meta;
mod ids;
mod invalid;
pub mod keys;
pub mod limits;
mod names;
pub mod problem;
pub mod routes;
mod text;
mod tier;
pub mod wire;

pub use config::{millis, Enforcement, LockClass, Mode, Namespace, QuorumPolicy};
pub use epoch::{EpochReason, EpochRecord};
pub use holder_meta::{HolderMeta, MAX_HOLDER_META_LEN};
pub use ids::{AttemptId, LeaseId, SpiffeId};
pub use invalid::InvalidInput;
pub use names::{is_name, validate_key, validate_name, MAX_KEY_LEN, MAX_NAME_LEN, NAME_PATTERN};
pub use palisade_fence::{Epoch, FencingToken, Revision};
pub use problem::ProblemKind;
pub use text::{
    validate_query_utf8, validate_text, TextFault, MAX_LABEL_LEN, MAX_REASON_LEN,
    MAX_REQUEST_ID_LEN, TEXT_PATTERN,
};
pub use tier::{RehomePhase, RehomeRecord, TieredSessionId};
