//! The overview's numbers: unprotected writes now and against the week before, refused
//! writes by reason, dropped events, audit gaps, the top writers without tokens, and the
//! hours stacked by finding.

use std::time::{Duration, SystemTime};

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::GenericClient;

use super::query::{hour_floor, FINDINGS, UNPROTECTED};
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

/// The first hour start at or after `t`.
fn hour_ceil(t: SystemTime) -> SystemTime {
    let floor = hour_floor(t);
    if floor == t {
        t
    } else {
        floor + Duration::from_secs(3600)
    }
}

/// Unprotected writes in `[from, to)` summed by the SQL expression `by` (a column of
/// both `write_event_hourly` and `write_event`, or `hour`): the counters of
/// `write_event_hourly` for the whole hours, `write_event` rows for the partial hours at
/// the two ends. Returns `(key, count)` rows, biggest first, at most `limit`.
async fn rolled_up<C: GenericClient>(
    client: &C,
    by: &str,
    from: SystemTime,
    to: SystemTime,
    limit: i64,
) -> Result<Vec<tokio_postgres::Row>, AuditError> {
    let (raw, rolled) = match by {
        "hour" => (
            "date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', finding",
            "hour, finding",
        ),
        "" => ("NULL::text", "NULL::text"),
        col => (col, col),
    };
    // A constant is no GROUP BY key: the total is one aggregate row.
    let group = if by.is_empty() {
        String::new()
    } else {
        format!(" GROUP BY {raw}")
    };
    let keys = if by == "hour" { "k, f" } else { "k" };
    let whole_from = hour_ceil(from).min(to);
    let whole_to = hour_floor(to).max(whole_from);
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&from, Type::TIMESTAMPTZ),
        (&whole_from, Type::TIMESTAMPTZ),
        (&whole_to, Type::TIMESTAMPTZ),
        (&to, Type::TIMESTAMPTZ),
        (&limit, Type::INT8),
    ];
    let edge = |lo: usize, hi: usize| {
        format!(
            "SELECT {raw}, count(*) FROM write_event WHERE outcome = '{UNPROTECTED}' \
             AND at >= ${lo} AND at < ${hi}{group}"
        )
    };
    let order = if by == "hour" { "k" } else { "n DESC, k" };
    let sql = format!(
        "SELECT {keys}, sum(n)::bigint AS n FROM ( \
            SELECT {rolled}, n FROM write_event_hourly WHERE hour >= $2 AND hour < $3 \
            UNION ALL {} UNION ALL {} \
         ) c ({keys}, n) GROUP BY {keys} ORDER BY {order} LIMIT $5",
        edge(1, 2),
        edge(3, 4)
    );
    Ok(client.query_typed(&sql, &params).await?)
}

async fn count<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<i64, AuditError> {
    let rows = rolled_up(client, "", from, to, 1).await?;
    Ok(rows.first().map_or(0, |r| r.get::<_, i64>(1)))
}

async fn top<C: GenericClient>(
    client: &C,
    column: &str,
    from: SystemTime,
    to: SystemTime,
) -> Result<Vec<(Option<String>, i64)>, AuditError> {
    let rows = rolled_up(client, column, from, to, TOP).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The top resources: `write_event` rows (a resource has too many values to roll up).
async fn top_resources<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<Vec<(Option<String>, i64)>, AuditError> {
    let rows = client
        .query_typed(
            "SELECT resource, count(*) FROM write_event WHERE outcome = 'unprotected' \
             AND at >= $1 AND at < $2 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $3",
            &[
                (&from, Type::TIMESTAMPTZ),
                (&to, Type::TIMESTAMPTZ),
                (&TOP, Type::INT8),
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

async fn stacked<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<Vec<StackedHour>, AuditError> {
    let rows = rolled_up(client, "hour", from, to, i64::MAX).await?;
    let mut hours: Vec<StackedHour> = Vec::new();
    let mut hour = hour_floor(from);
    while hour < to {
        hours.push((hour, [0; 4]));
        hour += Duration::from_secs(3600);
    }
    for r in &rows {
        let (h, f, n): (SystemTime, Option<String>, i64) = (r.get(0), r.get(1), r.get(2));
        let i = FINDINGS
            .iter()
            .position(|x| Some(*x) == f.as_deref())
            .unwrap_or(3);
        if let Some(slot) = hours.iter_mut().find(|(start, _)| *start == h) {
            slot.1[i] += n;
        }
    }
    Ok(hours)
}

async fn refused<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<[i64; 4], AuditError> {
    let rows = client
        .query_typed(
            "SELECT finding, count(*) FROM write_event WHERE outcome = 'rejected' \
             AND at >= $1 AND at < $2 GROUP BY 1",
            &[(&from, Type::TIMESTAMPTZ), (&to, Type::TIMESTAMPTZ)],
        )
        .await?;
    let mut out = [0; 4];
    for r in &rows {
        let f: Option<&str> = r.get(0);
        if let Some(i) = FINDINGS.iter().position(|x| Some(*x) == f) {
            out[i] += r.get::<_, i64>(1);
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
/// `to`). Every query goes out pipelined on the one connection.
pub(crate) async fn overview<C: GenericClient>(
    client: &C,
    from: SystemTime,
    to: SystemTime,
) -> Result<Overview, AuditError> {
    let (day, week, prev, window) = tokio::try_join!(
        count(client, to - DAY, to),
        count(client, to - WEEK, to),
        count(client, to - 2 * WEEK, to - WEEK),
        count(client, from, to),
    )?;
    let (refused, dropped, (gaps, gap_revisions)) = tokio::try_join!(
        refused(client, from, to),
        dropped(client, from, to),
        gaps(client)
    )?;
    let (callers, services, resources, hours) = tokio::try_join!(
        top(client, "caller", from, to),
        top(client, "service", from, to),
        top_resources(client, from, to),
        stacked(client, from, to),
    )?;
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
mod tests {
    use super::trend;

    #[test]
    fn trend_is_the_rounded_percent_change_and_none_without_a_base() {
        assert_eq!(trend(150, 100), Some(50));
        assert_eq!(trend(1, 3), Some(-67));
        assert_eq!(trend(5, 0), None);
        assert_eq!(trend(0, 4), Some(-100));
    }
}
