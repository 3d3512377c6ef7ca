//! The overview's numbers: unprotected writes now and against the week before, refused
//! writes by reason, dropped events, audit gaps, the top writers without tokens, and the
//! hours stacked by finding.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, IsolationLevel};

use super::query::{FINDINGS, REFUSED, UNPROTECTED};
use crate::AuditError;

/// Rows of each top list.
pub(crate) const TOP: i64 = 10;

const DAY: Duration = Duration::from_secs(24 * 3600);
const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// One hour of the stacked chart: `(hour start, count per finding in FINDINGS order)`.
pub(crate) type StackedHour = (SystemTime, [i64; 4]);

/// Everything the overview shows that the audit database knows.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overview {
    /// Unprotected writes in the 24 hours before `to`.
    pub(crate) unprotected_24h: i64,
    /// In the 7 days before `to`.
    pub(crate) unprotected_7d: i64,
    /// In the 7 days before those.
    pub(crate) unprotected_prev_7d: i64,
    /// Unprotected writes in the window.
    pub(crate) unprotected: i64,
    /// Refused writes in the window, by finding (FINDINGS order).
    pub(crate) refused: [i64; 4],
    /// Events the sinks dropped in the window.
    pub(crate) dropped: i64,
    /// Gap rows ever recorded, and the revisions they leave unread.
    pub(crate) gaps: i64,
    pub(crate) gap_revisions: i64,
    /// The top callers, services and resources writing unprotected in the window.
    pub(crate) callers: Vec<(Option<String>, i64)>,
    pub(crate) services: Vec<(Option<String>, i64)>,
    pub(crate) resources: Vec<(Option<String>, i64)>,
    /// The window's hours, stacked by finding.
    pub(crate) hours: Vec<StackedHour>,
}

const HOUR: Duration = Duration::from_secs(3600);

/// The start of the UTC `unit` (an hour or a day) holding `t`.
fn floor(t: SystemTime, unit: Duration) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + Duration::from_secs(secs - secs % unit.as_secs())
}

/// The first start of a UTC `unit` at or after `t`.
fn ceil(t: SystemTime, unit: Duration) -> SystemTime {
    let f = floor(t, unit);
    if f == t {
        t
    } else {
        f + unit
    }
}

/// Where the counts of one span of time are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Counters per UTC day.
    Day,
    /// Counters per hour.
    Hour,
    /// `write_event` rows.
    Row,
}

/// `[from, to)` of one source.
type Span = (Source, SystemTime, SystemTime);

/// `[from, to)` cut into spans, each read from the coarsest counters that hold it
/// exactly: its whole UTC days from daily counters (when `days`), the whole hours of the
/// rest from hourly counters (when `hours`), the rest from the rows. Empty spans are left
/// out, and neighbours read from the same source are one span.
fn spans(from: SystemTime, to: SystemTime, days: bool, hours: bool) -> Vec<Span> {
    let by_hour = |a: SystemTime, b: SystemTime, cut: &mut Vec<Span>| {
        if hours {
            let whole_from = ceil(a, HOUR).min(b);
            let whole_to = floor(b, HOUR).max(whole_from);
            cut.extend([
                (Source::Row, a, whole_from),
                (Source::Hour, whole_from, whole_to),
                (Source::Row, whole_to, b),
            ]);
        } else {
            cut.push((Source::Row, a, b));
        }
    };
    let mut cut = Vec::new();
    if from < to {
        if days {
            let whole_from = ceil(from, DAY).min(to);
            let whole_to = floor(to, DAY).max(whole_from);
            by_hour(from, whole_from, &mut cut);
            cut.push((Source::Day, whole_from, whole_to));
            by_hour(whole_to, to, &mut cut);
        } else {
            by_hour(from, to, &mut cut);
        }
    }
    let mut out: Vec<Span> = Vec::new();
    for (source, a, b) in cut.into_iter().filter(|(_, a, b)| a < b) {
        match out.last_mut() {
            Some(last) if last.0 == source && last.2 == a => last.2 = b,
            _ => out.push((source, a, b)),
        }
    }
    out
}

/// `[from, to)` as whole UTC days of daily counters, set right at each end by rows: an
/// end either adds the rows between it and the next day bound inward, or takes its whole
/// day and subtracts the rows of that day outside the range, whichever spans less time
/// before `now` (no rows are written ahead of time); rows alone when that is least.
/// Returns `(source, from, to, sign)`.
fn day_spans(
    from: SystemTime,
    to: SystemTime,
    now: SystemTime,
) -> Vec<(Source, SystemTime, SystemTime, i64)> {
    if from >= to {
        return Vec::new();
    }
    let cost = |a: SystemTime, b: SystemTime| b.min(now).duration_since(a).unwrap_or_default();
    let mut best = (cost(from, to), vec![(Source::Row, from, to, 1)]);
    for subtract_from in [false, true] {
        for subtract_to in [false, true] {
            let whole_from = if subtract_from {
                floor(from, DAY)
            } else {
                ceil(from, DAY)
            };
            let whole_to = if subtract_to {
                ceil(to, DAY)
            } else {
                floor(to, DAY)
            };
            if whole_from >= whole_to {
                continue;
            }
            let low = if subtract_from {
                (Source::Row, whole_from, from, -1)
            } else {
                (Source::Row, from, whole_from, 1)
            };
            let high = if subtract_to {
                (Source::Row, to, whole_to, -1)
            } else {
                (Source::Row, whole_to, to, 1)
            };
            let c = cost(low.1, low.2) + cost(high.1, high.2);
            if c < best.0 {
                best = (c, vec![low, (Source::Day, whole_from, whole_to, 1), high]);
            }
        }
    }
    best.1.retain(|(_, a, b, _)| a < b);
    best.1
}

/// A table of counters: its name, a condition on its rows (empty, or ending in `AND`),
/// and its time column.
type Counters = (&'static str, &'static str, &'static str);

/// One of the overview's sums of `write_event` rows of one outcome, by a key.
struct Sum {
    /// The rows' `outcome`.
    outcome: &'static str,
    /// The key over `write_event` rows; `None` for a total.
    raw: Option<&'static str>,
    /// The key over the counters (`NULL::text` for a total).
    rolled: &'static str,
    /// The daily and the hourly counters holding the key, if any.
    daily: Option<Counters>,
    hourly: Option<Counters>,
    /// The result's key columns (`k` or `k, f`), its order, its most rows.
    keys: &'static str,
    order: &'static str,
    limit: Option<i64>,
}

const HOURLY_FINDING_UNPROTECTED: Counters = (
    "write_event_hourly_finding",
    "outcome = 'unprotected' AND ",
    "hour",
);

/// Unprotected writes in all.
const TOTAL: Sum = Sum {
    outcome: UNPROTECTED,
    raw: None,
    rolled: "NULL::text",
    daily: None,
    hourly: Some(HOURLY_FINDING_UNPROTECTED),
    keys: "k",
    order: "k",
    limit: None,
};

/// Unprotected writes by hour and finding.
const STACKED: Sum = Sum {
    outcome: UNPROTECTED,
    raw: Some("date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', finding"),
    rolled: "hour, finding",
    daily: None,
    hourly: Some(HOURLY_FINDING_UNPROTECTED),
    keys: "k, f",
    order: "k, f",
    limit: None,
};

/// Refused writes by finding.
const REFUSED_BY_FINDING: Sum = Sum {
    outcome: REFUSED,
    raw: Some("finding"),
    rolled: "finding",
    daily: None,
    hourly: Some((
        "write_event_hourly_finding",
        "outcome = 'rejected' AND ",
        "hour",
    )),
    keys: "k",
    order: "k",
    limit: None,
};

/// The top unprotected writers by `column` (`caller` or `service`).
const fn top_by(column: &'static str) -> Sum {
    Sum {
        outcome: UNPROTECTED,
        raw: Some(column),
        rolled: column,
        daily: Some(("write_event_daily", "", "day")),
        hourly: Some(("write_event_hourly", "", "hour")),
        keys: "k",
        order: "n DESC, k",
        limit: Some(TOP),
    }
}

const TOP_CALLERS: Sum = top_by("caller");
const TOP_SERVICES: Sum = top_by("service");

/// The top resources written unprotected (no hourly counters: an hour holds about as
/// many resources as rows).
const TOP_RESOURCES: Sum = Sum {
    outcome: UNPROTECTED,
    raw: Some("resource"),
    rolled: "resource",
    daily: Some(("write_event_daily_resource", "", "day")),
    hourly: None,
    keys: "k",
    order: "n DESC, k",
    limit: Some(TOP),
};

impl Sum {
    /// The statement summing `[from, to)` as of `now` and its parameters (the spans'
    /// bounds): `(key..., n)` rows, keys with no writes left out.
    fn sql(&self, from: SystemTime, to: SystemTime, now: SystemTime) -> (String, Vec<SystemTime>) {
        let mut params = Vec::new();
        let mut branches = Vec::new();
        // Without hourly counters, an end of the range may be cheaper subtracted.
        let spans = if self.hourly.is_none() && self.daily.is_some() {
            day_spans(from, to, now)
        } else {
            spans(from, to, self.daily.is_some(), self.hourly.is_some())
                .into_iter()
                .map(|(source, a, b)| (source, a, b, 1))
                .collect()
        };
        for (source, a, b, sign) in spans {
            params.extend([a, b]);
            let (lo, hi) = (params.len() - 1, params.len());
            let counters = match source {
                Source::Day => self.daily,
                Source::Hour => self.hourly,
                Source::Row => None,
            };
            branches.push(match counters {
                Some((table, cond, time)) => format!(
                    "SELECT {}, n FROM {table} WHERE {cond}{time} >= ${lo} AND {time} < ${hi}",
                    self.rolled
                ),
                None => format!(
                    "SELECT {}, {}count(*) FROM write_event WHERE outcome = '{}' \
                     AND at >= ${lo} AND at < ${hi}{}",
                    self.raw.unwrap_or("NULL::text"),
                    if sign < 0 { "-" } else { "" },
                    self.outcome,
                    self.raw
                        .map(|k| format!(" GROUP BY {k}"))
                        .unwrap_or_default()
                ),
            });
        }
        let limit = self
            .limit
            .map(|l| format!(" LIMIT {l}"))
            .unwrap_or_default();
        let keys = self.keys;
        let sql = format!(
            "SELECT {keys}, sum(n)::bigint AS n FROM ({}) c ({keys}, n) GROUP BY {keys} \
             HAVING sum(n) > 0 ORDER BY {}{limit}",
            branches.join(" UNION ALL "),
            self.order
        );
        (sql, params)
    }

    /// The rows of [`Sum::sql`] over `[from, to)`; none for an empty range.
    async fn rows<C: GenericClient>(
        &self,
        client: &C,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Vec<tokio_postgres::Row>, AuditError> {
        if from >= to {
            return Ok(Vec::new());
        }
        let (sql, times) = self.sql(from, to, SystemTime::now());
        let params: Vec<(&(dyn ToSql + Sync), Type)> = times
            .iter()
            .map(|t| (t as &(dyn ToSql + Sync), Type::TIMESTAMPTZ))
            .collect();
        Ok(client.query_typed(&sql, &params).await?)
    }

    /// `(key, count)` rows of a one-key sum.
    async fn pairs<C: GenericClient>(
        &self,
        client: &C,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Vec<(Option<String>, i64)>, AuditError> {
        let rows = self.rows(client, from, to).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

async fn count<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<i64, AuditError> {
    let rows = TOTAL.rows(client, from, to).await?;
    Ok(rows.first().map_or(0, |r| r.get::<_, i64>(1)))
}

/// Where `finding` is in `FINDINGS` (an unknown one counts as the last).
fn finding_index(finding: Option<&str>) -> usize {
    FINDINGS
        .iter()
        .position(|x| Some(*x) == finding)
        .unwrap_or(FINDINGS.len() - 1)
}

/// Every hour of `[from, to)` stacked by finding, and their total.
async fn stacked<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<(Vec<StackedHour>, i64), AuditError> {
    let rows = STACKED.rows(client, from, to).await?;
    let first = floor(from, HOUR);
    let mut hours: Vec<StackedHour> = Vec::new();
    let mut hour = first;
    while hour < to {
        hours.push((hour, [0; 4]));
        hour += HOUR;
    }
    let mut total = 0;
    for r in &rows {
        let (h, f, n): (SystemTime, Option<String>, i64) = (r.get(0), r.get(1), r.get(2));
        total += n;
        let slot = h
            .duration_since(first)
            .ok()
            .and_then(|d| hours.get_mut((d.as_secs() / HOUR.as_secs()) as usize));
        if let Some(slot) = slot {
            slot.1[finding_index(f.as_deref())] += n;
        }
    }
    Ok((hours, total))
}

async fn refused<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<[i64; 4], AuditError> {
    let mut out = [0; 4];
    for (f, n) in REFUSED_BY_FINDING.pairs(client, from, to).await? {
        if let Some(i) = FINDINGS.iter().position(|x| Some(*x) == f.as_deref()) {
            out[i] += n;
        }
    }
    Ok(out)
}

async fn dropped<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<i64, AuditError> {
    let row = client
        .query_typed(
            "SELECT coalesce(sum(dropped), 0)::bigint FROM write_event WHERE outcome = 'dropped' \
             AND at >= $1 AND at < $2",
            &[(&from, Type::TIMESTAMPTZ), (&to, Type::TIMESTAMPTZ)],
        )
        .await?;
    Ok(row.first().map_or(0, |r| r.get(0)))
}

async fn gaps<C: GenericClient>(client: &C) -> Result<(i64, i64), AuditError> {
    let row = client
        .query_typed(
            "SELECT count(*), coalesce(sum(gap_to - gap_from + 1), 0)::bigint FROM audit_event \
             WHERE type = 'gap'",
            &[],
        )
        .await?;
    Ok(row.first().map_or((0, 0), |r| (r.get(0), r.get(1))))
}

/// The overview of `[from, to)` (at most two weeks; the 24-hour and 7-day tiles end at
/// `to`). Its statements read one snapshot (a read-only transaction) and go out together,
/// pipelined on the one connection, without parallel workers: each reads a few thousand
/// counters or index entries, less work than starting a worker process.
pub(crate) async fn overview(
    client: &mut tokio_postgres::Client,
    from: SystemTime,
    to: SystemTime,
) -> Result<Overview, AuditError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    tx.batch_execute("SET LOCAL max_parallel_workers_per_gather = 0")
        .await?;
    let c = &tx;
    let (
        day,
        week,
        prev,
        (hours, window),
        refused,
        dropped,
        (gaps, gap_revisions),
        callers,
        services,
        resources,
    ) = tokio::try_join!(
        count(c, to - DAY, to),
        count(c, to - WEEK, to),
        count(c, to - 2 * WEEK, to - WEEK),
        stacked(c, from, to),
        refused(c, from, to),
        dropped(c, from, to),
        gaps(c),
        TOP_CALLERS.pairs(c, from, to),
        TOP_SERVICES.pairs(c, from, to),
        TOP_RESOURCES.pairs(c, from, to),
    )?;
    tx.commit().await?;
    Ok(Overview {
        unprotected_24h: day,
        unprotected_7d: week,
        unprotected_prev_7d: prev,
        unprotected: window,
        refused,
        dropped,
        gaps,
        gap_revisions,
        callers,
        services,
        resources,
        hours,
    })
}

/// The change from `before` to `now` in percent, rounded; `None` when `before` is 0.
pub(crate) fn trend(now: i64, before: i64) -> Option<i64> {
    (before > 0).then(|| ((now - before) as f64 * 100.0 / before as f64).round() as i64)
}

#[cfg(test)]
mod tests;
