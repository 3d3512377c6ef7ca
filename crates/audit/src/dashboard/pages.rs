//! The HTML pages (maud: every value escaped).

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse};
use deadpool_postgres::Pool;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::query::{self, encode, FilterParams};
use super::timeline::{self, KeyQuery};
use super::{caption, chart, chart_window, rfc3339, Dash, DashError};
use crate::{reason_str, EpochAdvance, LockEventKind, WriteRecord};
use palisade_api::EpochReason;

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
.kind-epoch { color: #1f4e8c; font-weight: 600; }
.pager { margin: 12px 0; } .muted { color: #777; }
nav.picker { display: flex; gap: 10px; align-items: baseline; font-size: 13px; margin-bottom: 4px; }
nav.picker a, nav.picker strong { padding: 2px 8px; border-radius: 10px; }
nav.picker strong { background: #1f2d3a; color: #fff; } nav.picker a { color: #2c5d8f; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; margin-bottom: 16px; }
.tile { background: #fff; border: 1px solid #e3e3e0; padding: 10px 12px; }
.tile .label { font-size: 12px; color: #555; } .tile .value { font-size: 26px; font-weight: 600; margin: 4px 0; }
.tile .sub { font-size: 12px; color: #555; } .tile.alert .value { color: #b0261a; }
.tile .value a { color: inherit; text-decoration: none; } .tile .sub .reason { display: block; }
.up { color: #b0261a; } .down { color: #1e7b34; }
.tops { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 12px; }
.tops td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.gap td { background: #f1f0ec; }
tr.epoch td { background: #eef3fa; }
";

/// Where a page is, for the navigation and the time-range picker: its path, the query
/// it keeps when the range changes (a lock key, filters), and the range in force.
pub(super) struct Here<'a> {
    pub(super) path: &'static str,
    pub(super) keep: String,
    pub(super) range: Option<&'a str>,
    pub(super) from: Option<&'a str>,
    pub(super) to: Option<&'a str>,
}

impl Here<'_> {
    /// The range as a query string (`range=7d`, or `from=…&to=…`), for links.
    fn time_query(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [("range", self.range), ("from", self.from), ("to", self.to)] {
            if let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) {
                parts.push(format!("{k}={}", encode(v)));
            }
        }
        parts.join("&")
    }

    fn link(&self, path: &str, range: &str) -> String {
        let mut q: Vec<&str> = Vec::new();
        if !self.keep.is_empty() {
            q.push(&self.keep);
        }
        if !range.is_empty() {
            q.push(range);
        }
        if q.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", q.join("&"))
        }
    }
}

pub(super) fn layout(title: &str, here: &Here<'_>, body: Markup) -> Html<String> {
    let time = here.time_query();
    let nav = |path: &str| {
        if time.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{time}")
        }
    };
    let active = here.range.map(str::trim).filter(|r| !r.is_empty());
    let custom = here.from.is_some_and(|f| !f.trim().is_empty());
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
                        a href=(nav("/")) { "Overview" }
                        a href=(nav("/unprotected")) { "Unprotected writes" }
                        a href=(nav("/refused")) { "Refused writes" }
                        a href=(nav("/locks")) { "Lock timeline" }
                        a href=(nav("/force-releases")) { "Forced releases" }
                    }
                    main {
                        nav.picker {
                            span.muted { "Time range:" }
                            @for (name, _) in query::RANGES {
                                @if active == Some(name) && !custom {
                                    strong.range { (name) }
                                } @else {
                                    a.range href=(here.link(here.path, &format!("range={name}"))) { (name) }
                                }
                            }
                            @if custom {
                                strong.range { "custom" }
                            }
                            @if active.is_some() || custom {
                                a.range href=(here.link(here.path, "")) { "default" }
                            }
                        }
                        h1 { (title) }
                        (body)
                    }
                }
            }
        }
        .into_string(),
    )
}

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

fn token_cell(t: Option<palisade_fence::FencingToken>) -> String {
    t.map(|t| t.to_string()).unwrap_or_else(|| "—".to_owned())
}

fn write_row(r: &WriteRecord) -> Markup {
    html! {
        tr {
            td.mono.nowrap { (rfc3339(r.at)) }
            td { (r.service) }
            td.mono.resource { (opt(&r.resource)) }
            td { (opt(&r.method)) }
            td.mono.nowrap { (token_cell(r.token)) }
            td { (r.finding.map(|f| f.as_str()).unwrap_or("")) }
            td { (opt(&r.labels.namespace)) }
            td { (opt(&r.labels.class)) }
            td.mono { (opt(&r.caller)) }
        }
    }
}

/// The answer a refusal got, by finding.
fn refusal(finding: Option<crate::Finding>) -> &'static str {
    match finding {
        Some(crate::Finding::MissingToken) => "428 missing token",
        Some(crate::Finding::MalformedToken) => "400 malformed token",
        Some(crate::Finding::Stale) => "409 stale token",
        Some(crate::Finding::StoreUnavailable) => "503 store unavailable",
        _ => "",
    }
}

fn refused_row(r: &WriteRecord) -> Markup {
    html! {
        tr {
            td.mono.nowrap { (rfc3339(r.at)) }
            td { (r.service) }
            td.mono.resource { (opt(&r.resource)) }
            td { (opt(&r.method)) }
            td.reason { (refusal(r.finding)) }
            td.mono.nowrap { (token_cell(r.token)) }
            td.mono.nowrap { (token_cell(r.highest)) }
            td { (opt(&r.labels.namespace)) }
            td { (opt(&r.labels.class)) }
            td.mono { (opt(&r.caller)) }
        }
    }
}

impl FilterParams {
    fn here(&self, path: &'static str) -> Here<'_> {
        Here {
            path,
            keep: self.text_query(),
            range: self.range.as_deref(),
            from: self.from.as_deref(),
            to: self.to.as_deref(),
        }
    }
}

/// The filter row of a write table.
fn filter_form(path: &str, params: &FilterParams, finding_label: &str) -> Markup {
    let field = |name: &str, label: &str, value: &Option<String>| {
        let hint = if name == "from" || name == "to" {
            "2026-11-30T10:00"
        } else {
            "any"
        };
        html! { label { (label) input type="text" name=(name) value=(opt(value)) placeholder=(hint); } }
    };
    html! {
        form.filters method="get" action=(path) {
            (field("namespace", "Namespace", &params.namespace))
            (field("class", "Class", &params.class))
            (field("resource", "Resource", &params.resource))
            (field("service", "Service", &params.service))
            (field("caller", "Caller (SPIFFE ID)", &params.caller))
            (field("finding", finding_label, &params.finding))
            (field("from", "From (UTC)", &params.from))
            (field("to", "To (UTC)", &params.to))
            @if let Some(r) = &params.range { input type="hidden" name="range" value=(r); }
            button type="submit" { "Filter" }
            a href=(path) { "Clear" }
        }
    }
}

fn pager(
    path: &str,
    params: &FilterParams,
    cursor: bool,
    next: Option<query::Cursor>,
    limit: usize,
) -> Markup {
    let filters = params.filter_query();
    html! {
        p.pager {
            @if cursor { a href={ (path) "?" (filters) } { "Newest" } " " }
            @if let Some(next) = next {
                a.older href={ (path) "?" (filters) @if !filters.is_empty() { "&" } "before=" (next.encode()) "&limit=" (limit) } { "Older →" }
            }
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
        query::writes_page(&**client, query::UNPROTECTED, &filter, cursor, limit),
        query::hourly(&**client, &filter, from, to)
    )?;
    let filters = params.filter_query();
    let body = html! {
        (filter_form("/unprotected", &params, "Finding"))
        p { a href={ "/unprotected.csv?" (filters) } { "Export CSV" } }
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
        (pager("/unprotected", &params, cursor.is_some(), next, limit))
    };
    Ok(layout(
        "Unprotected writes",
        &params.here("/unprotected"),
        body,
    ))
}

/// The writes the fence layer refused (fenced resources: 428, 400, 409, 503), newest
/// first, with the refused token and the resource's mark.
pub(super) async fn refused(
    State(pool): State<Pool>,
    Query(params): Query<FilterParams>,
) -> Result<Html<String>, DashError> {
    let (filter, cursor, limit) = params.parse()?;
    let client = pool.get().await?;
    let (rows, next) =
        query::writes_page(&**client, query::REFUSED, &filter, cursor, limit).await?;
    let body = html! {
        p.muted { "Writes to fenced resources that the fence layer refused, reported by services whose layer has "
            code { "with_refused_events" } " (or " code { "with_fenced_events" } "). A stale token shows the resource's mark it was below." }
        (filter_form("/refused", &params, "Reason (finding)"))
        @if rows.is_empty() {
            p.muted.empty { "No refused writes match." }
        } @else {
            table.refused {
                thead { tr {
                    th { "At (UTC)" } th { "Service" } th { "Resource" } th { "Method" } th { "Answer" }
                    th { "Token" } th { "Mark" } th { "Namespace" } th { "Class" } th { "Caller" }
                } }
                tbody { @for r in &rows { (refused_row(r)) } }
            }
        }
        (pager("/refused", &params, cursor.is_some(), next, limit))
    };
    Ok(layout("Refused writes", &params.here("/refused"), body))
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

/// The query string of the lock timeline and the forced releases.
#[derive(Debug, Default, Deserialize)]
pub(super) struct KeyParams {
    pub(super) key: Option<String>,
    pub(super) range: Option<String>,
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
}

impl KeyParams {
    /// The time range, parsed as the write tables parse theirs.
    pub(super) fn window(&self) -> Result<query::Filter, DashError> {
        let params = FilterParams {
            range: self.range.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            ..FilterParams::default()
        };
        Ok(params.parse()?.0)
    }

    /// The key asked for, trimmed and checked (`None` when empty).
    pub(super) fn key(&self) -> Result<Option<&str>, DashError> {
        let key = self.key.as_deref().map(str::trim).filter(|k| !k.is_empty());
        query::check_lock_key(key.unwrap_or_default())?;
        Ok(key)
    }

    fn here(&self, path: &'static str, keep: String) -> Here<'_> {
        Here {
            path,
            keep,
            range: self.range.as_deref(),
            from: self.from.as_deref(),
            to: self.to.as_deref(),
        }
    }
}

fn kind_class(kind: LockEventKind) -> &'static str {
    match kind {
        LockEventKind::Grant => "kind-grant",
        LockEventKind::Release => "kind-release",
        LockEventKind::Expire => "kind-expire",
        LockEventKind::Force => "kind-force",
        LockEventKind::Epoch => "kind-epoch",
        _ => "kind-gap",
    }
}

/// What an epoch advance row says: the new epoch, why, and for a rehome the move.
fn advance_text(a: &EpochAdvance) -> String {
    let epoch = a.record.epoch.get();
    let why = match (&a.record.reason, &a.rehome) {
        (EpochReason::Rehome, Some(r)) => format!(
            "rehome: namespace {} moved from tier {} to tier {}",
            r.namespace, r.from, r.to
        ),
        (EpochReason::Rehome, None) => {
            "rehome (the home tier's switch record is not in the audit trail)".to_owned()
        }
        (reason, _) => reason_str(*reason).to_owned(),
    };
    format!(
        "Epoch advanced to {epoch} ({why}). Tokens after it carry epoch {epoch}: each is above every token before it."
    )
}

/// A lock's timeline. The time range does not apply: a lock's history is shown whole
/// (at most 500 events), so the range only travels on to the other pages.
pub(super) async fn locks(
    State(dash): State<Dash>,
    Query(params): Query<KeyParams>,
) -> Result<Html<String>, DashError> {
    params.window()?;
    let key = params.key()?;
    let client = dash.pool.get().await?;
    let (entries, known) = match key {
        Some(k) => {
            let q = KeyQuery::parse(k);
            let (entries, known) = tokio::try_join!(
                timeline::lock_timeline(&**client, &q, query::PAGE_MAX),
                timeline::known_keys(&**client)
            )?;
            (entries, known)
        }
        None => (Vec::new(), timeline::known_keys(&**client).await?),
    };
    let tiers = dash.tiers().await;
    let tier = |ns: &Option<String>| -> String {
        match (&tiers, ns) {
            (Some(t), Some(ns)) => t.get(ns).cloned().unwrap_or_else(|| "—".to_owned()),
            _ => "—".to_owned(),
        }
    };
    let found = timeline::has_events(&entries);
    let body = html! {
        form.filters method="get" action="/locks" {
            label { "Lock (namespace/class/key, or the key alone)"
                input type="text" name="key" list="known-keys" value=(key.unwrap_or("")) style="width: 420px"; }
            datalist id="known-keys" { @for k in &known { option value=(k) {} } }
            @if let Some(r) = &params.range { input type="hidden" name="range" value=(r); }
            button type="submit" { "Show" }
        }
        @if let Some(k) = key {
            @if !found {
                p.muted.empty { "No events for " code { (k) } "."
                    @if !entries.is_empty() { " Its events may be in the audit gaps below: etcd history the tailer could not read." } }
            }
            @if !entries.is_empty() {
                table.timeline {
                    thead { tr {
                        th { "Recorded (UTC)" } th { "Revision" } th { "Event" } th { "Token" } th { "Holder (SPIFFE ID)" }
                        th { "Lock" } th { "Forced by / approved by / reason" } th { "Cluster" } th { "Tier" }
                    } }
                    tbody { @for e in &entries {
                        @let ev = &e.event;
                        @if let Some(a) = &e.advance {
                            tr.epoch {
                                td.mono.nowrap { (ev.recorded_at.map(rfc3339).unwrap_or_default()) }
                                td.mono.nowrap { (ev.revision) }
                                td class=(kind_class(ev.kind)) { "epoch" }
                                td colspan="4" { (advance_text(a)) }
                                td.mono.nowrap { (ev.cluster_id) }
                                td.tier { @if let Some(r) = &a.rehome { (r.to) } @else { "—" } }
                            }
                        } @else if let Some((from, to)) = ev.gap {
                            tr.gap {
                                td.mono.nowrap { (ev.recorded_at.map(rfc3339).unwrap_or_default()) }
                                td.mono.nowrap { (from) "–" (to) }
                                td class=(kind_class(ev.kind)) { "gap" }
                                td colspan="5" { "Audit gap: revisions " (from) " to " (to) " were compacted before the tailer read them; events in them are unknown." }
                                td.mono.nowrap { (ev.cluster_id) }
                            }
                        } @else {
                            tr {
                                td.mono.nowrap { (ev.recorded_at.map(rfc3339).unwrap_or_default()) }
                                td.mono.nowrap { (ev.revision) @if ev.seq > 0 { "." (ev.seq) } }
                                td class=(kind_class(ev.kind)) { (ev.kind.as_str()) }
                                td.mono.nowrap { (token_cell(ev.token)) }
                                td.mono { (opt(&ev.spiffe_id)) }
                                td.mono { (opt(&ev.namespace)) "/" (opt(&ev.class)) "/" (opt(&ev.lock_key)) }
                                td { @if let Some(f) = &e.force {
                                    (f.requester) " / " (f.approver) " / " (f.reason)
                                } }
                                td.mono.nowrap { (ev.cluster_id) }
                                td.tier { (tier(&ev.namespace)) }
                            }
                        }
                    } }
                }
                p.muted { "The whole history of the lock is shown (its latest 500 events): the time range applies to the other pages only. "
                    "Times are when the audit tailer stored each event (etcd history has none). The tier is the namespace's "
                    code { "cluster_tier" } " as its config stores it now"
                    @if tiers.is_none() { " (unknown: the dashboard was started without etcd)" } "." }
            }
        }
    };
    let keep = key
        .map(|k| format!("key={}", encode(k)))
        .unwrap_or_default();
    Ok(layout("Lock timeline", &params.here("/locks", keep), body))
}

pub(super) async fn force_releases(
    State(pool): State<Pool>,
    Query(params): Query<KeyParams>,
) -> Result<Html<String>, DashError> {
    let window = params.window()?;
    let client = pool.get().await?;
    let rows = query::force_releases(&**client, &window, query::PAGE_MAX).await?;
    let resets = query::fence_resets(&**client, &window, query::PAGE_MAX).await?;
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
        h2 #resets { "Mark resets" }
        p.muted { "High-water marks lowered with palisade fence reset. The actor is the database role that ran it." }
        @if resets.is_empty() {
            p.muted.empty { "No mark resets." }
        } @else {
            table.resets {
                thead { tr {
                    th { "At (UTC)" } th { "Resource" } th { "From" } th { "To" }
                    th { "Checked against" } th { "Actor" } th { "Reason" }
                } }
                tbody { @for r in &resets {
                    tr {
                        td.mono.nowrap { (rfc3339(r.at)) }
                        td.mono { (r.resource) }
                        td.mono { (r.old) }
                        td.mono { (r.new) }
                        @match &r.lock {
                            Some((lock, floor)) => td.mono { "lock " (lock) ", floor " (floor) },
                            None => td.unknown { "lock unknown" },
                        }
                        td.mono { (r.actor) }
                        td { (r.reason) }
                    }
                } }
            }
        }
    };
    Ok(layout(
        "Forced releases",
        &params.here("/force-releases", String::new()),
        body,
    ))
}
