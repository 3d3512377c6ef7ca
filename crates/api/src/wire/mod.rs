//! The JSON bodies of the service, one module per route group. Request bodies refuse
//! unknown fields; responses are read leniently, so a newer service can add fields.
//!
//! Units: `*_ms` fields are milliseconds; tokens are decimal `u64` strings
//! ([`FencingToken`](crate::FencingToken)'s serde form); revisions are numbers.

mod admin;
mod force;
mod locks;
mod sessions;

pub use admin::{
    AdvanceBody, AdvanceReason, ClassBody, EpochQuery, NamespaceBody, RehomeBody, RehomeView,
};
pub use force::{ApproveView, ForceRequestBody, ForceRequestView, ForceTargetView, ReleasedView};
pub use locks::{
    AcquireBody, ForeignKeyView, HoldView, HolderView, ReleaseBody, StatusQuery, StatusView,
    WaiterView,
};
pub use sessions::{ForcedHoldView, KeepaliveView, OpenSessionBody, SessionView};
