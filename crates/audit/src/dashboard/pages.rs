//! The HTML pages (maud: every value escaped).

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse};
use deadpool_postgres::Pool;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::query::{self, encode, FilterParams};
use super::{caption, chart, chart_window, rfc3339, DashError};
use crate::{LockEventKind, WriteRecord};

const CSS: &str = "
body { font-family: system-ui, sans-serif; margin: 0; color: #222; background: #f6f6f4; }
header { background: #1f2d3a; color: #fff; padding: 10px 24px; display: flex; gap: 24px; align-items: baseline; }
header a { color: #cfe3f5; text-decoration: none; } header strong { font-size: 18px; }
main { padding: 16px 24px; }
form.filters { display: flex; flex-wrap: wrap; gap: 8px; align-items: end; margin-bottom: 12px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: #555; }
form.filters input { padding: 4px 6px; font-size: 13px; width: 150px; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e3e3e0; vertical-align: top; }
th { background: #ecebe7; } td.mono { font-family: ui-monospace, monospace; word-break: break-all; }
td.nowrap { white-space: nowrap; word-break: normal; }
.chart { background: #fff; border: 1px solid #e3e3e0; margin: 8px 0 16px; max-width: 100%; height: auto; }
.kind-grant { color: #1e7b34; } .kind-release { color: #2c5d8f; } .kind-expire { color: #a66a00; }
.kind-force { color: #b0261a; font-weight: 600; } .kind-gap { color: #777; font-style: italic; }
.pager { margin: 12px 0; } .muted { color: #777; }
";

fn layout(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · Palisade audit" }
                    style { (maud::PreEscaped(CSS)) }
                }
                body {
                    header {
                        strong { "Palisade audit" }
                        a href="/unprotected" { "Unprotected writes" }
                        a href="/locks" { "Lock timeline" }
                        a href="/force-releases" { "Forced releases" }
                    }
                    main { h1 { (title) } (body) }
                }
            }
        }
        .into_string(),
    )
}

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

fn write_row(r: &WriteRecord) -> Markup {
    html! {
        tr {
            td.mono.nowrap { (rfc3339(r.at)) }
            td { (r.service) }
            td.mono.resource { (opt(&r.resource)) }
            td { (opt(&r.method)) }
            td.mono.nowrap { (r.token.map(|t| t.to_string()).unwrap_or_else(|| "—".to_owned())) }
            td { (r.finding.map(|f| f.as_str()).unwrap_or("")) }
            td { (opt(&r.labels.namespace)) }
            td { (opt(&r.labels.class)) }
            td.mono { (opt(&r.caller)) }
        }
    }
}

pub(super) async fn unprotected(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<Html<String>, DashError> {
    let (filter, cursor, limit) = params.parse()?;
    let client = pool.get().await?;
    let (from, to) = chart_window(&filter);
    // Both queries go out together on the one connection (pipelined: one round trip).
    let ((rows, next), hours) = tokio::try_join!(
        query::unprotected_page(&**client, &filter, cursor, limit),
        query::hourly(&**client, &filter, from, to)
    )?;
    let filters = params.filter_query();
    let field = |name: &str, label: &str, value: &Option<String>| {
        let hint = if name == "from" || name == "to" {
            "2026-11-30T10:00"
        } else {
            "any"
        };
        html! { label { (label) input type="text" name=(name) value=(opt(value)) placeholder=(hint); } }
    };
    let body = html! {
        form.filters method="get" action="/unprotected" {
            (field("namespace", "Namespace", &params.namespace))
            (field("class", "Class", &params.class))
            (field("resource", "Resource", &params.resource))
            (field("service", "Service", &params.service))
            (field("caller", "Caller (SPIFFE ID)", &params.caller))
            (field("from", "From (UTC)", &params.from))
            (field("to", "To (UTC)", &params.to))
            button type="submit" { "Filter" }
            a href="/unprotected" { "Clear" }
            a href={ "/unprotected.csv?" (filters) } { "Export CSV" }
        }
        (chart::hourly_svg(&caption(&filter), &hours))
        @if rows.is_empty() {
            p.muted.empty { "No unprotected writes match." }
        } @else {
            table.writes {
                thead { tr {
                    th { "At (UTC)" } th { "Service" } th { "Resource" } th { "Method" } th { "Token" }
                    th { "Finding" } th { "Namespace" } th { "Class" } th { "Caller" }
                } }
                tbody { @for r in &rows { (write_row(r)) } }
            }
        }
        p.pager {
            @if cursor.is_some() { a href={ "/unprotected?" (filters) } { "Newest" } " " }
            @if let Some(next) = next {
                a.older href={ "/unprotected?" (filters) @if !filters.is_empty() { "&" } "before=" (next.encode()) "&limit=" (limit) } { "Older →" }
            }
        }
    };
    Ok(layout("Unprotected writes", body))
}

pub(super) async fn chart(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<impl IntoResponse, DashError> {
    let (filter, _, _) = params.parse()?;
    let client = pool.get().await?;
    let (from, to) = chart_window(&filter);
    let hours = query::hourly(&**client, &filter, from, to).await?;
    let svg = chart::hourly_svg(&caption(&filter), &hours).into_string();
    Ok((
        [(header::CONTENT_TYPE, "image/svg+xml; charset=utf-8")],
        svg,
    ))
}

/// The query string of the lock timeline.
#[derive(Debug, Deserialize)]
pub(super) struct KeyParams {
    pub(super) key: Option<String>,
}

fn kind_class(kind: LockEventKind) -> &'static str {
    match kind {
        LockEventKind::Grant => "kind-grant",
        LockEventKind::Release => "kind-release",
        LockEventKind::Expire => "kind-expire",
        LockEventKind::Force => "kind-force",
        _ => "kind-gap",
    }
}

pub(super) async fn locks(
    State(pool): State<Pool>,
    Query(params): Query<KeyParams>,
) -> Result<Html<String>, DashError> {
    let key = params
        .key
        .as_deref()
        .map(str::trim)
        .filter(|k| !k.is_empty());
    query::check_lock_key(key.unwrap_or_default())?;
    let entries = match key {
        Some(k) => {
            let client = pool.get().await?;
            query::lock_timeline(&**client, k, query::PAGE_MAX).await?
        }
        None => Vec::new(),
    };
    let body = html! {
        form.filters method="get" action="/locks" {
            label { "Lock key" input type="text" name="key" value=(key.unwrap_or("")) style="width: 360px"; }
            button type="submit" { "Show" }
        }
        @if let Some(k) = key {
            @if entries.is_empty() {
                p.muted.empty { "No events for " code { (k) } "." }
            } @else {
                table.timeline {
                    thead { tr {
                        th { "Revision" } th { "Event" } th { "Token" } th { "Holder (SPIFFE ID)" }
                        th { "Namespace / class" } th { "Forced by / approved by / reason" } th { "Cluster" }
                    } }
                    tbody { @for e in &entries {
                        tr {
                            td.mono.nowrap { (e.event.revision) @if e.event.seq > 0 { "." (e.event.seq) } }
                            td class=(kind_class(e.event.kind)) { (e.event.kind.as_str()) }
                            td.mono.nowrap { (e.event.token.map(|t| t.to_string()).unwrap_or_else(|| "—".to_owned())) }
                            td.mono { (opt(&e.event.spiffe_id)) }
                            td { (opt(&e.event.namespace)) " / " (opt(&e.event.class)) }
                            td { @if let Some(f) = &e.force {
                                (f.requester) " / " (f.approver) " / " (f.reason)
                            } }
                            td.mono.nowrap { (e.event.cluster_id) }
                        }
                    } }
                }
            }
        }
    };
    Ok(layout("Lock timeline", body))
}

pub(super) async fn force_releases(State(pool): State<Pool>) -> Result<Html<String>, DashError> {
    let client = pool.get().await?;
    let rows = query::force_releases(&**client, query::PAGE_MAX).await?;
    let body = html! {
        @if rows.is_empty() {
            p.muted.empty { "No forced releases." }
        } @else {
            table.forces {
                thead { tr {
                    th { "At (UTC)" } th { "Lock key" } th { "Revision" } th { "Grant ended" } th { "Token" }
                    th { "Requester" } th { "Approver" }
                    th { "Reason" } th { "Class was fenced" } th { "Request" }
                } }
                tbody { @for f in &rows {
                    tr {
                        td.mono.nowrap { (rfc3339(f.at)) }
                        td.mono { a href={ "/locks?key=" (encode(&f.lock_key)) } { (f.lock_key) } }
                        td.mono { (f.revision) }
                        td.mono { @if let Some(g) = f.grant_rev { (g) } @else { "—" } }
                        td.mono { @if let Some(t) = f.token { (t) } @else { "—" } }
                        td.mono { (f.requester) }
                        td.mono { (f.approver) }
                        td { (f.reason) }
                        td { @if f.class_was_fenced { "yes" } @else { "no (advisory)" } }
                        td.mono { (f.request_id) }
                    }
                } }
            }
        }
    };
    Ok(layout("Forced releases", body))
}
