//! Extractors whose rejections are problems: `Body` (JSON), `PathArgs`, `QueryArgs`.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::Json;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::problem::Problem;
use palisade_api::ProblemKind;

/// `Json<T>` whose rejections are problems (400, 413, 415, 422; 415 also for a body with a
/// `Content-Encoding` other than `identity`), for a body that must be
/// a JSON object: serde lets a struct be read from an array of its fields in order
/// (`[5000]` for `{"ttl_ms": 5000}`), which no request body of this API is, so an array
/// (or any other non-object) is refused with 422 "invalid type: sequence, expected a JSON
/// object".
pub(super) struct Body<T>(pub(super) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        // A compressed body would be read as if it were plain (no route decodes one).
        if let Some(coding) = req
            .headers()
            .get(axum::http::header::CONTENT_ENCODING)
            .filter(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            return Err(Problem::new(
                ProblemKind::InvalidInput,
                format!(
                    "Content-Encoding {:?} is not supported: send the JSON body uncompressed",
                    String::from_utf8_lossy(coding.as_bytes())
                ),
            )
            .with_status(axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE));
        }
        match Json::<Object<T>>::from_request(req, state).await {
            Ok(Json(Object(v))) => Ok(Body(v)),
            Err(r) => Err(json_problem(&r)),
        }
    }
}

/// `T` read from a JSON object only.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(ObjectVisitor(std::marker::PhantomData))
            .map(Object)
    }
}

fn json_problem(r: &JsonRejection) -> Problem {
    Problem::new(ProblemKind::InvalidInput, r.body_text()).with_status(r.status())
}

/// `Path<T>` whose rejections are 400 problems.
pub(super) struct PathArgs<T>(pub(super) T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathArgs<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathArgs(p.0))
            .map_err(|r: PathRejection| Problem::new(ProblemKind::InvalidInput, r.body_text()))
    }
}

/// `Query<T>` whose rejections are 400 problems; a parameter that is not UTF-8 once
/// percent-decoded is refused ([`palisade_api::validate_query_utf8`]) rather than read
/// with U+FFFD in its place.
pub(super) struct QueryArgs<T>(pub(super) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        palisade_api::validate_query_utf8(parts.uri.query().unwrap_or_default())?;
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|r: QueryRejection| Problem::new(ProblemKind::InvalidInput, r.body_text()))
    }
}
