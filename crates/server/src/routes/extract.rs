//! Extractors whose rejections are problems: `Body` (JSON), `PathArgs`, `QueryArgs`.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::Json;
use serde::de::DeserializeOwned;

use crate::problem::Problem;
use palisade_api::ProblemKind;

/// `Json<T>` whose rejections are problems (400, 413, 415, 422).
pub(super) struct Body<T>(pub(super) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(r) => Err(json_problem(&r)),
        }
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

/// `Query<T>` whose rejections are 400 problems.
pub(super) struct QueryArgs<T>(pub(super) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryArgs(q.0))
            .map_err(|r: QueryRejection| Problem::new(ProblemKind::InvalidInput, r.body_text()))
    }
}
