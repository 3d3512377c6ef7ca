//! CSV export of the filtered unprotected writes.
//!
//! Resources, callers and service names come from the requests that were audited, so an
//! attacker chooses them. A cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage
//! return is read as a formula by spreadsheet programs; such cells get a leading `'`
//! (OWASP's advice on CSV injection). The JSON API keeps the values verbatim.

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use deadpool_postgres::Pool;

use super::query::{self, FilterParams};
use super::{rfc3339, DashError};

/// The columns, in order.
const HEADER: [&str; 12] = [
    "at",
    "service",
    "resource",
    "method",
    "token",
    "finding",
    "namespace",
    "class",
    "caller",
    "enforcement",
    "highest",
    "id",
];

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
        let opt = |v: &Option<String>| inert(v.as_deref().unwrap_or_default());
        out.write_record([
            rfc3339(r.at),
            inert(&r.service),
            opt(&r.resource),
            opt(&r.method),
            r.token.map(|t| t.to_string()).unwrap_or_default(),
            r.finding.map(|f| f.as_str().to_owned()).unwrap_or_default(),
            opt(&r.labels.namespace),
            opt(&r.labels.class),
            opt(&r.caller),
            r.fenced
                .map(|f| if f { "fenced" } else { "advisory" }.to_owned())
                .unwrap_or_default(),
            r.highest.map(|t| t.to_string()).unwrap_or_default(),
            r.id.to_string(),
        ])?;
    }
    let body = out
        .into_inner()
        .map_err(|e| ::csv::Error::from(e.into_error()))?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"unprotected-writes.csv\"",
            ),
        ],
        body,
    ))
}

/// `cell` as a spreadsheet shows text: prefixed with `'` when it would start a formula.
fn inert(cell: &str) -> String {
    match cell.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{cell}"),
        _ => cell.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::inert;

    #[test]
    fn formula_cells_are_made_inert_and_others_kept_verbatim() {
        for bad in [
            "=HYPERLINK(\"http://x\")",
            "+1",
            "-2+3",
            "@SUM(A1)",
            "\tx",
            "\rx",
        ] {
            assert_eq!(inert(bad), format!("'{bad}"));
        }
        for good in ["", "/orders/=1", "spiffe://td/a", "<script>", "'quoted"] {
            assert_eq!(inert(good), good);
        }
    }
}
