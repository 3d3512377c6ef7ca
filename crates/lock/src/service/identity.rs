//! Who is calling: the SPIFFE ID established by the transport, or (dev mode only) a
//! header.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::problem::{Problem, ProblemKind};
use super::routes::AppState;
use crate::model::SpiffeId;

/// The dev-mode identity header. Honoured only by a service built with
/// [`ServiceOptions::insecure_dev_identity`](super::ServiceOptions::insecure_dev_identity);
/// otherwise a request carrying it is refused with 401.
pub const DEV_IDENTITY_HEADER: &str = "x-palisade-dev-identity";

/// The caller's SPIFFE ID as established by the transport (the URI SAN of a verified
/// client certificate). A TLS acceptor inserts it as a request extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity(pub SpiffeId);

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) SpiffeId);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let header = parts.headers.get(DEV_IDENTITY_HEADER);
        if let Some(value) = header {
            if !state.dev_identity {
                return Err(Problem::new(
                    ProblemKind::Unauthenticated,
                    "the dev identity header is refused: the service was not started with the insecure dev identity option",
                ));
            }
            let id = value
                .to_str()
                .ok()
                .and_then(|v| SpiffeId::new(v).ok())
                .ok_or_else(|| {
                    Problem::new(
                        ProblemKind::Unauthenticated,
                        "the dev identity header is not a SPIFFE ID",
                    )
                })?;
            return Ok(Caller(id));
        }
        match parts.extensions.get::<PeerIdentity>() {
            Some(PeerIdentity(id)) => Ok(Caller(id.clone())),
            None => Err(Problem::new(
                ProblemKind::Unauthenticated,
                "no caller identity: a client certificate with a SPIFFE ID URI SAN is required",
            )),
        }
    }
}
