//! The OpenAPI 3.1 document (`GET /v1/openapi.json`): the problem responses of each
//! route, the `Problem` schema and the security schemes. The paths and the request and
//! response schemas come from the handlers' `utoipa::path` attributes (`routes/`).
//!
//! Each route lists the problem kinds it can answer ([`ProblemKind`]) as a set below;
//! the document gives one response per status code whose schema is `Problem` with
//! `type` restricted to the kinds of that status. Routes with a JSON body also answer
//! `invalid-input` as 413 (body over the limit), 415 (not JSON) and 422 (JSON of the
//! wrong shape).

use std::collections::BTreeMap;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Ref, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, RefOr, Response};

use super::identity::DEV_IDENTITY_HEADER;
use palisade_api::ProblemKind;

/// The responses of `kinds`, one per status code. `body`: the route takes a JSON body.
fn problem_responses(kinds: &[ProblemKind], body: bool) -> BTreeMap<String, RefOr<Response>> {
    let mut by_status: BTreeMap<u16, Vec<ProblemKind>> = BTreeMap::new();
    for &kind in kinds {
        by_status
            .entry(kind.status().as_u16())
            .or_default()
            .push(kind);
        if body && kind == ProblemKind::InvalidInput {
            for status in [413, 415, 422] {
                by_status.entry(status).or_default().push(kind);
            }
        }
    }
    by_status
        .into_iter()
        .map(|(status, kinds)| {
            let slugs: Vec<&str> = kinds.iter().map(|k| k.slug()).collect();
            let schema = AllOfBuilder::new()
                .item(Ref::from_schema_name("Problem"))
                .item(
                    ObjectBuilder::new().property(
                        "type",
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .enum_values(Some(kinds.iter().map(|k| k.type_uri()))),
                    ),
                );
            let mut response = ResponseBuilder::new()
                .description(format!("problem: {}", slugs.join(", ")))
                .content(
                    "application/problem+json",
                    ContentBuilder::new().schema(Some(schema)).build(),
                );
            if kinds.contains(&ProblemKind::QuotaExceeded) {
                response = response.header(
                    "Retry-After",
                    HeaderBuilder::new()
                        .schema(
                            ObjectBuilder::new()
                                .schema_type(Type::Integer)
                                .minimum(Some(1)),
                        )
                        .description(Some(
                            "whole seconds until the op_rate_quota bucket has an operation",
                        ))
                        .build(),
                );
            }
            (status.to_string(), RefOr::T(response.build()))
        })
        .collect()
}

macro_rules! problems {
    ($($(#[$doc:meta])* $name:ident { body: $body:expr, kinds: [$($kind:ident),* $(,)?] })*) => {$(
        $(#[$doc])*
        pub(crate) struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                problem_responses(&[$(ProblemKind::$kind),*], $body)
            }
        }
    )*};
}

problems! {
    /// `POST /v1/sessions`.
    OpenProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        QuotaExceeded, QuorumLost, Upstream, Internal, WrongTier] }
    /// `POST /v1/sessions/{session}/keepalive`.
    KeepaliveProblems { body: false, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        SessionLost, QuorumLost, Upstream, Internal] }
    /// `DELETE /v1/sessions/{session}`.
    CloseProblems { body: false, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        SessionLost, QuorumLost, Upstream, Internal] }
    /// `POST /v1/locks/acquire`.
    /// `shutting-down`: the replica is stopping and ended the wait (`Retry-After`).
    /// `already-held`, `acquire-in-flight`: the session holds or waits for the lock under
    /// another `attempt`. `epoch-store-unavailable`: the durable epoch record could not be
    /// written before the grant's token could be handed out (`Retry-After`).
    AcquireProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        DeadlineExceeded, AlreadyHeld, AcquireInFlight, SessionLost, QuotaExceeded, EpochMismatch,
        QuorumLost, Upstream, Internal, WrongTier, NamespaceMoving, ShuttingDown,
        EpochStoreUnavailable] }
    /// `POST /v1/locks/release`.
    ReleaseProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        NotHeld, HoldForced, SessionLost, QuotaExceeded, QuorumLost, Upstream, Internal] }
    /// `GET /v1/locks/status`.
    StatusProblems { body: false, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        QuotaExceeded, QuorumLost, Upstream, Internal] }
    /// `GET /v1/namespaces`.
    ListNamespacesProblems { body: false, kinds: [Unauthenticated, QuorumLost, Upstream, Internal] }
    /// `PUT /v1/namespaces/{ns}`.
    PutNamespaceProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden,
        QuorumLost, Upstream, Internal] }
    /// `GET /v1/namespaces/{ns}/classes`.
    ListClassesProblems { body: false, kinds: [InvalidInput, Unauthenticated, Forbidden,
        QuorumLost, Upstream, Internal] }
    /// `PUT /v1/namespaces/{ns}/classes/{class}`.
    /// `namespace-moving`: a rehome is moving the namespace (its classes are copied).
    PutClassProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        NamespaceMoving, QuorumLost, Upstream, Internal] }
    /// `GET /v1/epoch`.
    ShowEpochProblems { body: false, kinds: [InvalidInput, Unauthenticated, Forbidden] }
    /// `POST /v1/epoch/advance`.
    /// `deadline-exceeded`: the steps of an advance (read etcd's record, store the durable
    /// one, write etcd's) share one time budget, three etcd request timeouts.
    AdvanceEpochProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden,
        EpochExhausted, DeadlineExceeded, QuorumLost, Upstream, Internal, EpochStoreUnavailable] }
    /// `POST /v1/namespaces/{ns}/rehome`.
    RehomeProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        NamespaceMoving, EpochExhausted, DeadlineExceeded, QuorumLost, Upstream, Internal,
        EpochStoreUnavailable] }
    /// `POST /v1/force-releases`.
    RequestForceProblems { body: true, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        NotHeld, QuorumLost, Upstream, Internal] }
    /// `POST /v1/force-releases/{id}/approve`.
    ApproveForceProblems { body: false, kinds: [InvalidInput, Unauthenticated, Forbidden, NotFound,
        AlreadyApproved, ForceTargetGone, QuorumLost, Upstream, Internal] }
}

/// Adds what the attributes cannot say: the `Problem` schema (every `type` URI), the
/// two ways a caller is identified, and the document-wide error note.
pub(super) struct Finish;

impl utoipa::Modify for Finish {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let problem = ObjectBuilder::new()
            .description(Some(
                "RFC 9457 problem details. `type` is stable per kind: `urn:palisade:problem:<slug>`; \
                 `title` is the slug; `detail` is for people, not for matching.",
            ))
            .property(
                "type",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(ProblemKind::ALL.iter().map(|k| k.type_uri()))),
            )
            .required("type")
            .property(
                "title",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(ProblemKind::ALL.iter().map(|k| k.slug()))),
            )
            .required("title")
            .property(
                "status",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(400))
                    .maximum(Some(599)),
            )
            .required("status")
            .property("detail", ObjectBuilder::new().schema_type(Type::String))
            .required("detail");
        components.schemas.insert("Problem".into(), problem.into());
        components.add_security_scheme(
            "mtls",
            SecurityScheme::MutualTls {
                description: Some(
                    "The caller is the SPIFFE ID (URI SAN) of its client certificate.".into(),
                ),
                extensions: None,
            },
        );
        components.add_security_scheme(
            "dev_identity",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                DEV_IDENTITY_HEADER,
                "INSECURE dev mode only (loopback, started with --insecure-dev-identity): \
                 the caller's SPIFFE ID.",
            ))),
        );
        openapi.security = Some(vec![
            SecurityRequirement::new("mtls", Vec::<String>::new()),
            SecurityRequirement::new("dev_identity", Vec::<String>::new()),
        ]);
    }
}
