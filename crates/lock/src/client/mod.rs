//! A Rust client of the lock service (feature `client`): sessions with a background
//! keepalive, and holds that release on drop.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade_lock::client::ClientError> {
//! use std::time::Duration;
//! use palisade_lock::client::Client;
//! use palisade_lock::Mode;
//!
//! let client = Client::new("http://127.0.0.1:8080")?.with_dev_identity("spiffe://acme/billing");
//! let session = client.open_session(Duration::from_secs(10)).await?;
//! let hold = session.acquire("orders", "rows", "order/42", Mode::Exclusive, Duration::from_secs(5)).await?;
//! let token = hold.token();          // send as `Fencing-Token: <token>`
//! # let _ = token;
//! hold.release().await?;
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! - [`Client::open_session`] opens a session and starts one keepalive task that renews
//!   it every TTL/3. [`ClientSession::lost`] completes when the service says the session
//!   is gone, or when no renewal succeeded for a whole TTL (measured from when the last
//!   successful renewal was sent), or when it is closed.
//! - [`ClientSession`] is `Clone` and `Send + Sync`: share it across tasks.
//! - [`RemoteHold`] carries the token; dropping it without [`RemoteHold::release`]
//!   releases it in the background (best effort; the session's expiry is the backstop).
//!
//! Transport: plain HTTP (the service's dev mode, identity from a header). mTLS is not
//! implemented in the client yet.

mod error;
mod http;
mod session;

pub use error::{ClientError, ClientErrorKind};
pub use session::{Client, ClientSession, RemoteHold};
