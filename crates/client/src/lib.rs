//! A Rust client of Palisade's lock service: sessions with one background keepalive
//! task, and holds that carry their fencing token and release on drop. Builds without
//! etcd-client, tonic or protoc: it speaks only the wire contract of `palisade-api`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade_client::ClientError> {
//! use std::time::Duration;
//! use palisade_client::Client;
//! use palisade_client::Mode;
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
//! - [`RemoteHold`] carries the token. [`RemoteHold::lost`] completes when its session
//!   ends or when a keepalive reports the hold force-released ([`RemoteHold::loss`]
//!   says which).
//! - [`RemoteHold::release`] is sent again while its answer is lost (no answer, a reset
//!   connection, a 5xx) until a definite answer or its budget runs out; then it reports
//!   [`ClientErrorKind::OutcomeUnknown`] and goes on trying in the background while the
//!   session lives. Dropping a hold without releasing it releases it in the background
//!   the same way.
//!
//! - An acquire that the service answers 503 `quorum-lost` (etcd could not commit in
//!   time) is sent again with backoff within the acquire's wait
//!   ([`Client::acquire`] says how).
//!
//! Transport: mTLS ([`Client::new_mtls`] with a [`ClientTls`]: the service's CA bundle
//! and the client's certificate and key, from PEM files or memory; rustls with the
//! `ring` provider), where the caller is the SPIFFE ID in the client certificate's URI
//! SAN; or plain HTTP to a service in dev mode ([`Client::new`] and
//! [`Client::with_dev_identity`]). The service refuses a handshake with a client
//! certificate from another CA: requests then fail with
//! [`ProblemKind::Unauthenticated`] and no HTTP status; no client certificate, or
//! one without a SPIFFE ID, gets 401, the same kind.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade_client::ClientError> {
//! use palisade_client::{Client, ClientTls};
//!
//! let tls = ClientTls::from_ca_file("ca.pem")?.with_identity_files("svid.pem", "svid.key")?;
//! let client = Client::new_mtls("https://locks.internal:8443", tls)?;
//! # let _ = client; Ok(()) }
//! ```
//!
//! Errors are [`ClientError`]s: the service's problem `type` as a [`ClientErrorKind`],
//! the HTTP status and the problem's `detail`, or a transport or configuration failure.

mod error;
mod hold;
mod http;
mod release;
mod session;
mod tls;
mod unavailable;

pub use error::{ClientError, ClientErrorKind};
pub use hold::{HoldLoss, RemoteHold};
pub use palisade_api::{FencingToken, HolderMeta, Mode, ProblemKind, Revision};
/// The DER certificate and key types [`ClientTls`] takes (from `rustls`).
pub use rustls::pki_types;
pub use session::{Client, ClientSession, DEFAULT_OPEN_WAIT};
pub use tls::ClientTls;
