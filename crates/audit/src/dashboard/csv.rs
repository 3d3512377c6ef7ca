//! CSV export of the filtered unprotected writes.

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use deadpool_postgres::Pool;

use super::query::{self, FilterParams};
use super::{rfc3339, DashError};

/// The columns, in order.
const HEADER: [&str; 12] =
    ["at", "service", "resource", "method", "token", "finding", "namespace", "class", "caller", "enforcement", "highest", "id"];

pub(super) async fn unprotected(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<impl IntoResponse, DashError> {
    let (filter, _, _) = params.parse()?;
    let client = pool.get().await?;
    let rows = query::unprotected_all(&**client, &filter, query::CSV_MAX).await?;
    let mut out = ::csv::Writer::from_writer(Vec::with_capacity(rows.len() * 160));
    out.write_record(HEADER)?;
    for r in &rows {
        let opt = |v: &Option<String>| v.clone().unwrap_or_default();
        out.write_record([
            rfc3339(r.at),
            r.service.clone(),
            opt(&r.resource),
            opt(&r.method),
            r.token.map(|t| t.to_string()).unwrap_or_default(),
            r.finding.map(|f| f.as_str().to_owned()).unwrap_or_default(),
            opt(&r.labels.namespace),
            opt(&r.labels.class),
            opt(&r.caller),
            r.fenced.map(|f| if f { "fenced" } else { "advisory" }.to_owned()).unwrap_or_default(),
            r.highest.map(|t| t.to_string()).unwrap_or_default(),
            r.id.to_string(),
        ])?;
    }
    let body = out.into_inner().map_err(|e| ::csv::Error::from(e.into_error()))?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (header::CONTENT_DISPOSITION, "attachment; filename=\"unprotected-writes.csv\""),
        ],
        body,
    ))
}
