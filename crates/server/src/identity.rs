//! Who is calling: the SPIFFE ID established by the transport, or (dev mode only) a
//! header.
//!
//! # Identity and authorization
//!
//! The caller is a SPIFFE ID from the transport ([`PeerIdentity`], set by the mTLS
//! acceptor of `serve_tls`: no client certificate, or a certificate
//! without exactly one SPIFFE URI SAN -> 401 on every route; a certificate that does not
//! chain to the client CAs -> the handshake is refused), or, only with [`ServiceOptions::insecure_dev_identity`], from the
//! [`DEV_IDENTITY_HEADER`]. No identity, or the dev header without dev mode: 401. What a
//! caller may do comes from [`Authz`] (TOML, reloadable). Sessions belong to the identity
//! that opened them: keepalive, acquire, release and close by anyone else are 403.
//!

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::routes::AppState;
use crate::problem::Problem;
use palisade_api::ProblemKind;
use palisade_api::SpiffeId;

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
            if parts
                .headers
                .get_all(DEV_IDENTITY_HEADER)
                .iter()
                .nth(1)
                .is_some()
            {
                // Two callers named: which one acts would depend on the header order.
                return Err(Problem::new(
                    ProblemKind::Unauthenticated,
                    "the dev identity header is sent more than once: send one SPIFFE ID",
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
            None if state.dev_identity => Err(Problem::new(
                ProblemKind::Unauthenticated,
                format!(
                    "no caller identity: send the {DEV_IDENTITY_HEADER} header with a SPIFFE ID \
                     (the service runs in dev mode; the CLI's --dev-identity sends it)"
                ),
            )),
            None => Err(Problem::new(
                ProblemKind::Unauthenticated,
                "no caller identity: a client certificate with a SPIFFE ID URI SAN is required",
            )),
        }
    }
}
