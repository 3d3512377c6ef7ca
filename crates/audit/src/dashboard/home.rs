//! The overview, the dashboard's landing page (and its JSON): who writes without a
//! current token, to what, and whether it is getting better.

use axum::extract::{Query, State};
use axum::response::Html;
use axum::Json;
use maud::{html, Markup};
use serde::Serialize;

use super::chart::{self, FINDING_COLOURS};
use super::live::Now;
use super::overview::{self, trend, Overview};
use super::pages::{layout, Here};
use super::query::{encode, FilterParams, FINDINGS};
use super::{chart_window, rfc3339, Dash, DashError};

/// The overview's JSON (`/api/overview`): the numbers of the page.
#[derive(Debug, Serialize)]
pub(super) struct OverviewJson {
    from: String,
    to: String,
    unprotected: i64,
    unprotected_24h: i64,
    unprotected_7d: i64,
    unprotected_prev_7d: i64,
    /// Percent change of the last 7 days against the 7 before; `null` when those had none.
    trend_7d_percent: Option<i64>,
    /// Refused writes in the window, by finding.
    refused: std::collections::BTreeMap<&'static str, i64>,
    dropped: i64,
    gaps: i64,
    gap_revisions: i64,
    /// `null` when the dashboard has no etcd to ask, or etcd did not answer.
    holds_now: Option<u64>,
    waiters_now: Option<u64>,
    top_callers: Vec<Top>,
    top_services: Vec<Top>,
    top_resources: Vec<Top>,
}

/// One row of a top list.
#[derive(Debug, Serialize)]
pub(super) struct Top {
    name: Option<String>,
    count: i64,
}

fn tops(rows: &[(Option<String>, i64)]) -> Vec<Top> {
    rows.iter()
        .map(|(name, count)| Top {
            name: name.clone(),
            count: *count,
        })
        .collect()
}

async fn load(
    dash: &Dash,
    params: &FilterParams,
) -> Result<
    (
        Overview,
        Option<Now>,
        std::time::SystemTime,
        std::time::SystemTime,
    ),
    DashError,
> {
    let (filter, _, _) = params.parse()?;
    let (from, to) = chart_window(&filter);
    let mut client = dash.pool.get().await?;
    let (data, now) = tokio::join!(overview::overview(&mut client, from, to), dash.now());
    Ok((data?, now, from, to))
}

pub(super) async fn api(
    State(dash): State<Dash>,
    Query(params): Query<FilterParams>,
) -> Result<Json<OverviewJson>, DashError> {
    let (o, now, from, to) = load(&dash, &params).await?;
    Ok(Json(OverviewJson {
        from: rfc3339(from),
        to: rfc3339(to),
        unprotected: o.unprotected,
        unprotected_24h: o.unprotected_24h,
        unprotected_7d: o.unprotected_7d,
        unprotected_prev_7d: o.unprotected_prev_7d,
        trend_7d_percent: trend(o.unprotected_7d, o.unprotected_prev_7d),
        refused: FINDINGS.iter().copied().zip(o.refused).collect(),
        dropped: o.dropped,
        gaps: o.gaps,
        gap_revisions: o.gap_revisions,
        holds_now: now.map(|n| n.holds),
        waiters_now: now.map(|n| n.waiters),
        top_callers: tops(&o.callers),
        top_services: tops(&o.services),
        top_resources: tops(&o.resources),
    }))
}

fn tile(id: &str, label: &str, value: Markup, sub: Markup, alert: bool) -> Markup {
    html! {
        div.tile.alert[alert] id=(id) {
            div.label { (label) }
            div.value { (value) }
            div.sub { (sub) }
        }
    }
}

/// A top list whose rows link to the unprotected writes they count.
fn top_table(
    id: &str,
    title: &str,
    filter: &str,
    rows: &[(Option<String>, i64)],
    time: &str,
) -> Markup {
    html! {
        div {
            h2 { (title) }
            @if rows.is_empty() {
                p.muted.empty { "None in this range." }
            } @else {
                table id=(id) {
                    thead { tr { th { (filter) } th { "Unprotected writes" } } }
                    tbody { @for (name, n) in rows {
                        tr {
                            td.mono { @if let Some(name) = name {
                                a href={ "/unprotected?" (filter) "=" (encode(name)) "&" (time) } { (name) }
                            } @else { span.muted { "(unknown)" } } }
                            td.n { (n) }
                        }
                    } }
                }
            }
        }
    }
}

pub(super) async fn page(
    State(dash): State<Dash>,
    Query(params): Query<FilterParams>,
) -> Result<Html<String>, DashError> {
    let (o, now, from, to) = load(&dash, &params).await?;
    let here = Here {
        path: "/",
        keep: String::new(),
        range: params.range.as_deref(),
        from: params.from.as_deref(),
        to: params.to.as_deref(),
    };
    // The top lists link to exactly the window they counted.
    let time = format!(
        "from={}&to={}",
        encode(&rfc3339(from)),
        encode(&rfc3339(to))
    );
    let t = trend(o.unprotected_7d, o.unprotected_prev_7d);
    let refused_total: i64 = o.refused.iter().sum();
    let live = |v: Option<u64>| match v {
        Some(n) => html! { (n) },
        None => html! { span.muted { "—" } },
    };
    let live_note = if dash.live.is_none() {
        "needs the dashboard started with etcd"
    } else if now.is_none() {
        "etcd did not answer"
    } else {
        "in etcd now"
    };
    let names = [
        "missing token",
        "malformed token",
        "stale token",
        "store unavailable",
    ];
    let body = html! {
        p.muted.window { "From " (rfc3339(from)) " to " (rfc3339(to)) " (UTC)." }
        div.tiles {
            (tile("tile-unprotected", "Unprotected writes, in range", html! { a href={ "/unprotected?" (time) } { (o.unprotected) } },
                html! { "last 24 h: " strong #unprotected-24h { (o.unprotected_24h) } }, o.unprotected > 0))
            (tile("tile-week", "Unprotected writes, last 7 days", html! { (o.unprotected_7d) },
                html! { "week before: " (o.unprotected_prev_7d) " · "
                    @match t {
                        Some(p) if p > 0 => { span.up #trend { "▲ " (p) "%" } }
                        Some(p) if p < 0 => { span.down #trend { "▼ " (p.abs()) "%" } }
                        Some(_) => { span #trend { "no change" } }
                        None => { span.muted #trend { "no base" } }
                    } }, t.is_some_and(|p| p > 0)))
            (tile("tile-refused", "Refused writes, in range", html! { a href={ "/refused?" (time) } { (refused_total) } },
                html! { @for (i, name) in names.iter().enumerate() {
                    span.reason id={ "refused-" (FINDINGS[i]) } { (name) ": " (o.refused[i]) } } }, false))
            (tile("tile-holds", "Holds now", live(now.map(|n| n.holds)), html! { (live_note) }, false))
            (tile("tile-waiters", "Waiters now", live(now.map(|n| n.waiters)), html! { (live_note) }, false))
            (tile("tile-gaps", "Audit gaps (all time)", html! { (o.gaps) },
                html! { (o.gap_revisions) " etcd revisions unread" }, o.gaps > 0))
            (tile("tile-dropped", "Dropped write events, in range", html! { (o.dropped) },
                html! { "queue full at a sink" }, o.dropped > 0))
        }
        (chart::stacked_svg("Unprotected writes per hour by finding", names, &o.hours))
        div.tops {
            (top_table("top-callers", "Top callers", "caller", &o.callers, &time))
            (top_table("top-services", "Top services", "service", &o.services, &time))
            (top_table("top-resources", "Top resources", "resource", &o.resources, &time))
        }
        p.muted { "Colours: " @for (i, name) in names.iter().enumerate() {
            span style={ "color: " (FINDING_COLOURS[i]) } { "■ " } (name) " " } }
    };
    Ok(layout("Overview", &here, body))
}
