//! The dashboard's reads: filters, keyset pages, hourly counts, timelines.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use palisade_fence::{FencingToken, Revision};
use serde::Deserialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use crate::{
    AuditError, ClusterId, FenceReset, Finding, ForceRelease, Labels, Outcome, WriteRecord,
};

/// Rows per page by default, and at most.
pub(crate) const PAGE: usize = 50;
pub(crate) const PAGE_MAX: usize = 500;
/// Most rows in one CSV export.
pub(crate) const CSV_MAX: usize = 100_000;
/// Most hours in one chart (two weeks).
pub(crate) const CHART_MAX_HOURS: u64 = 14 * 24;

/// The query string of the unprotected-writes views, as sent.
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct FilterParams {
    pub(crate) namespace: Option<String>,
    pub(crate) class: Option<String>,
    pub(crate) resource: Option<String>,
    pub(crate) service: Option<String>,
    pub(crate) caller: Option<String>,
    /// RFC 3339 (`2026-11-30T10:00:00Z`) or a form's `2026-11-30T10:00` (UTC).
    pub(crate) from: Option<String>,
    pub(crate) to: Option<String>,
    /// A window ending now (or at `to`): one of [`RANGES`]; `from` wins when both are set.
    pub(crate) range: Option<String>,
    /// `missing_token`, `malformed_token`, `stale` or `store_unavailable`.
    pub(crate) finding: Option<String>,
    /// The cursor of the next page (from the previous page).
    pub(crate) before: Option<String>,
    pub(crate) limit: Option<usize>,
}

/// Longest text filter, in bytes: the longest value filtered on, a SPIFFE ID.
pub(crate) const MAX_FILTER_LEN: usize = 2048;

/// A bad query string.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FilterError {
    #[error("{field}: not a time like 2026-11-30T10:00:00Z")]
    Time { field: &'static str },
    #[error("before: not a cursor from a previous page")]
    Cursor,
    #[error("from: not before {end} (the window [from, {end}) would be empty)")]
    EmptyWindow {
        /// `to`, or `now` when no `to` was given.
        end: &'static str,
    },
    #[error("range: not one of 1h, 6h, 24h, 7d, 14d")]
    Range,
    #[error("finding: not one of missing_token, malformed_token, stale, store_unavailable")]
    Finding,
    /// A text filter or lock key that breaks its rule (a NUL, which PostgreSQL cannot
    /// take, or another control character; too long).
    #[error("{0}")]
    Text(#[from] palisade_api::InvalidInput),
}

/// Parsed filters; empty strings mean "any".
#[derive(Debug, Default, Clone)]
pub(crate) struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) class: Option<String>,
    pub(crate) resource: Option<String>,
    pub(crate) service: Option<String>,
    pub(crate) caller: Option<String>,
    pub(crate) finding: Option<String>,
    pub(crate) from: Option<SystemTime>,
    pub(crate) to: Option<SystemTime>,
}

impl Filter {
    /// The text filters as (column, value): each names a `write_event` column and its value
    /// must match exactly.
    pub(crate) fn text_fields(&self) -> [(&'static str, &Option<String>); 6] {
        [
            ("namespace", &self.namespace),
            ("class", &self.class),
            ("resource", &self.resource),
            ("service", &self.service),
            ("caller", &self.caller),
            ("finding", &self.finding),
        ]
    }
}

/// Where a page starts: strictly older than this `(at, id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    at: SystemTime,
    id: Uuid,
}

impl Cursor {
    pub(crate) fn encode(&self) -> String {
        format!("{}_{}", micros(self.at), self.id.simple())
    }

    fn decode(s: &str) -> Option<Cursor> {
        let (at, id) = s.split_once('_')?;
        let at: i64 = at.parse().ok()?;
        Some(Cursor {
            at: from_micros(at),
            id: Uuid::parse_str(id).ok()?,
        })
    }
}

fn micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    }
}

fn from_micros(m: i64) -> SystemTime {
    if m >= 0 {
        UNIX_EPOCH + Duration::from_micros(m as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(m.unsigned_abs())
    }
}

/// Parses RFC 3339 in UTC, also without seconds (what `<input type=datetime-local>` sends).
pub(crate) fn parse_time(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    humantime::parse_rfc3339_weak(s)
        .ok()
        .or_else(|| humantime::parse_rfc3339_weak(&format!("{s}:00")).ok())
}

fn nonempty(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// A text filter, trimmed (empty means any), checked by the text rule of
/// [`palisade_api::validate_text`] with a bound of [`MAX_FILTER_LEN`] bytes.
fn text_filter(v: &Option<String>, field: &'static str) -> Result<Option<String>, FilterError> {
    let v = nonempty(v);
    if let Some(s) = &v {
        palisade_api::validate_text(field, s, MAX_FILTER_LEN)?;
    }
    Ok(v)
}

/// Checks the lock key of a timeline, unless it is empty (no key asked for): the rule of
/// [`palisade_api::validate_key`], so no control character and at most
/// [`palisade_api::MAX_KEY_LEN`] bytes.
pub(crate) fn check_lock_key(key: &str) -> Result<(), FilterError> {
    if !key.is_empty() {
        palisade_api::validate_key(key)?;
    }
    Ok(())
}

/// The windows of the time-range picker, as `(name, length)`.
pub(crate) const RANGES: [(&str, Duration); 5] = [
    ("1h", Duration::from_secs(3600)),
    ("6h", Duration::from_secs(6 * 3600)),
    ("24h", Duration::from_secs(24 * 3600)),
    ("7d", Duration::from_secs(7 * 24 * 3600)),
    ("14d", Duration::from_secs(14 * 24 * 3600)),
];

/// The length of a named window of [`RANGES`].
pub(crate) fn range_length(name: &str) -> Option<Duration> {
    RANGES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
}

/// The values of `write_event.finding` that a write without a current token can have.
pub(crate) const FINDINGS: [&str; 4] = [
    "missing_token",
    "malformed_token",
    "stale",
    "store_unavailable",
];

impl FilterParams {
    pub(crate) fn parse(&self) -> Result<(Filter, Option<Cursor>, usize), FilterError> {
        let time = |v: &Option<String>, field| match nonempty(v) {
            None => Ok(None),
            Some(s) => parse_time(&s).map(Some).ok_or(FilterError::Time { field }),
        };
        let finding = nonempty(&self.finding);
        if finding.as_deref().is_some_and(|f| !FINDINGS.contains(&f)) {
            return Err(FilterError::Finding);
        }
        let to = time(&self.to, "to")?;
        let from = match (time(&self.from, "from")?, nonempty(&self.range)) {
            (Some(from), _) => Some(from),
            (None, Some(range)) => {
                let length = range_length(&range).ok_or(FilterError::Range)?;
                Some(to.unwrap_or_else(SystemTime::now) - length)
            }
            (None, None) => None,
        };
        if let Some(from) = from {
            let (end, at) = match to {
                Some(to) => ("to", to),
                None => ("now", SystemTime::now()),
            };
            if from >= at {
                return Err(FilterError::EmptyWindow { end });
            }
        }
        let filter = Filter {
            namespace: text_filter(&self.namespace, "namespace")?,
            class: text_filter(&self.class, "class")?,
            resource: text_filter(&self.resource, "resource")?,
            service: text_filter(&self.service, "service")?,
            caller: text_filter(&self.caller, "caller")?,
            finding,
            from,
            to,
        };
        let cursor = match nonempty(&self.before) {
            None => None,
            Some(s) => Some(Cursor::decode(&s).ok_or(FilterError::Cursor)?),
        };
        Ok((
            filter,
            cursor,
            self.limit.unwrap_or(PAGE).clamp(1, PAGE_MAX),
        ))
    }

    /// The text filters alone (no time, cursor or limit) as a query string, for links.
    pub(crate) fn text_query(&self) -> String {
        let pairs = [
            ("namespace", &self.namespace),
            ("class", &self.class),
            ("resource", &self.resource),
            ("service", &self.service),
            ("caller", &self.caller),
            ("finding", &self.finding),
        ];
        pairs
            .iter()
            .filter_map(|(k, v)| nonempty(v).map(|v| format!("{k}={}", encode(&v))))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The filters (not the cursor or limit) as a query string, for links.
    pub(crate) fn filter_query(&self) -> String {
        let pairs = [
            ("namespace", &self.namespace),
            ("class", &self.class),
            ("resource", &self.resource),
            ("service", &self.service),
            ("caller", &self.caller),
            ("finding", &self.finding),
            ("range", &self.range),
            ("from", &self.from),
            ("to", &self.to),
        ];
        pairs
            .iter()
            .filter_map(|(k, v)| nonempty(v).map(|v| format!("{k}={}", encode(&v))))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A WHERE clause with numbered parameters and their types (so a query goes out with
/// `query_typed`: parse, bind and execute in one round trip, no separate prepare).
struct Where {
    clauses: Vec<String>,
    params: Vec<(Box<dyn ToSql + Sync + Send>, Type)>,
}

impl Where {
    fn new(base: &str) -> Self {
        Where {
            clauses: vec![base.to_owned()],
            params: Vec::new(),
        }
    }

    /// Adds `clause`, where each `$?` is the next parameter (all the same value).
    fn add(&mut self, clause: &str, value: impl ToSql + Sync + Send + 'static, ty: Type) {
        self.params.push((Box::new(value), ty));
        self.clauses
            .push(clause.replace("$?", &format!("${}", self.params.len())));
    }

    /// The rows of `outcome` (`unprotected` or `rejected`) that match `filter`.
    fn writes(outcome: &'static str, filter: &Filter) -> Self {
        let mut w = Where::new(&format!("outcome = '{outcome}'"));
        for (col, v) in filter.text_fields() {
            if let Some(v) = v {
                w.add(&format!("{col} = $?"), v.clone(), Type::TEXT);
            }
        }
        if let Some(from) = filter.from {
            w.add("at >= $?", from, Type::TIMESTAMPTZ);
        }
        if let Some(to) = filter.to {
            w.add("at < $?", to, Type::TIMESTAMPTZ);
        }
        w
    }

    fn sql(&self) -> String {
        self.clauses.join(" AND ")
    }

    fn params(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        self.params
            .iter()
            .map(|(p, t)| (p.as_ref() as &(dyn ToSql + Sync), t.clone()))
            .collect()
    }
}

const WRITE_COLUMNS: &str =
    "id, at, service, outcome, resource, method, token, highest, finding, enforcement, namespace, class, caller, dropped";

fn token(v: Option<i64>) -> Option<FencingToken> {
    v.and_then(|t| FencingToken::try_from(t).ok())
}

fn write_record(row: &Row) -> WriteRecord {
    let outcome = match row.get::<_, &str>("outcome") {
        "admitted" => Outcome::Admitted,
        "rejected" => Outcome::Rejected,
        "dropped" => Outcome::Dropped,
        _ => Outcome::Unprotected,
    };
    let finding = row.get::<_, Option<&str>>("finding").map(|f| match f {
        "current" => Finding::Current,
        "missing_token" => Finding::MissingToken,
        "malformed_token" => Finding::MalformedToken,
        "stale" => Finding::Stale,
        _ => Finding::StoreUnavailable,
    });
    WriteRecord {
        id: row.get("id"),
        at: row.get("at"),
        service: row.get("service"),
        outcome,
        resource: row.get("resource"),
        method: row.get("method"),
        token: token(row.get("token")),
        highest: token(row.get("highest")),
        finding,
        fenced: row
            .get::<_, Option<&str>>("enforcement")
            .map(|e| e == "fenced"),
        labels: Labels {
            namespace: row.get("namespace"),
            class: row.get("class"),
        },
        caller: row.get("caller"),
        dropped: row.get::<_, Option<i64>>("dropped").map(|n| n as u64),
    }
}

/// Unprotected writes (`write_event.outcome`).
pub(crate) const UNPROTECTED: &str = "unprotected";
/// Writes the fence layer refused.
pub(crate) const REFUSED: &str = "rejected";

/// One page of the writes of `outcome` ([`UNPROTECTED`] or [`REFUSED`]), newest first,
/// and the cursor of the next page.
pub(crate) async fn writes_page<C: GenericClient>(
    client: &C,
    outcome: &'static str,
    filter: &Filter,
    cursor: Option<Cursor>,
    limit: usize,
) -> Result<(Vec<WriteRecord>, Option<Cursor>), AuditError> {
    let mut w = Where::writes(outcome, filter);
    if let Some(c) = cursor {
        w.params.push((Box::new(c.at), Type::TIMESTAMPTZ));
        w.params.push((Box::new(c.id), Type::UUID));
        let n = w.params.len();
        w.clauses.push(format!("(at, id) < (${}, ${n})", n - 1));
    }
    let sql = format!(
        "SELECT {WRITE_COLUMNS} FROM write_event WHERE {} ORDER BY at DESC, id DESC LIMIT {}",
        w.sql(),
        limit + 1
    );
    let rows = client.query_typed(&sql, &w.params()).await?;
    let mut records: Vec<WriteRecord> = rows.iter().map(write_record).collect();
    let next = if records.len() > limit {
        records.truncate(limit);
        records.last().map(|r| Cursor { at: r.at, id: r.id })
    } else {
        None
    };
    Ok((records, next))
}

/// Every unprotected write matching `filter`, newest first, up to `max`.
pub(crate) async fn unprotected_all<C: GenericClient>(
    client: &C,
    filter: &Filter,
    max: usize,
) -> Result<Vec<WriteRecord>, AuditError> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = writes_page(
            client,
            UNPROTECTED,
            filter,
            cursor,
            PAGE_MAX.min(max - all.len()),
        )
        .await?;
        all.extend(page);
        match next {
            Some(c) if all.len() < max => cursor = Some(c),
            _ => return Ok(all),
        }
    }
}

/// Unprotected writes per hour over `[from, to)`, `from` rounded down to the hour; every
/// hour is present, zero or not. Returns `(hour start, count)`.
///
/// Whole hours are read from `write_event_hourly` (the counts that migration 3's
/// triggers keep with the rows), the partial hours at either end from `write_event`.
/// A `resource` filter is not rolled up: then every hour is counted from `write_event`
/// through its `(resource, at)` index.
pub(crate) async fn hourly<C: GenericClient>(
    client: &C,
    filter: &Filter,
    from: SystemTime,
    to: SystemTime,
) -> Result<Vec<(SystemTime, i64)>, AuditError> {
    let whole_from = hour_ceil(from);
    let whole_to = hour_floor(to);
    let rows = if filter.resource.is_some() || whole_from >= whole_to {
        let mut f = filter.clone();
        f.from = Some(from);
        f.to = Some(to);
        let w = Where::writes(UNPROTECTED, &f);
        let sql = format!(
            "SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, count(*) \
             FROM write_event WHERE {} GROUP BY 1 ORDER BY 1",
            w.sql()
        );
        client.query_typed(&sql, &w.params()).await?
    } else {
        // $1..$k: the text filters; then from, whole_from, whole_to, to.
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = Vec::new();
        let mut text = String::new();
        for (col, v) in filter.text_fields() {
            if let Some(v) = v {
                params.push((v, Type::TEXT));
                text.push_str(&format!(" AND {col} = ${}", params.len()));
            }
        }
        let k = params.len();
        for t in [&from, &whole_from, &whole_to, &to] {
            params.push((t, Type::TIMESTAMPTZ));
        }
        let (p_from, p_whole_from, p_whole_to, p_to) = (k + 1, k + 2, k + 3, k + 4);
        let base = |lo: usize, hi: usize| {
            format!(
                "SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', count(*) FROM write_event \
                 WHERE outcome = 'unprotected'{text} AND at >= ${lo} AND at < ${hi} GROUP BY 1"
            )
        };
        let sql = format!(
            "SELECT hour, sum(n)::bigint FROM ( \
                SELECT hour, n FROM write_event_hourly WHERE hour >= ${p_whole_from} AND hour < ${p_whole_to}{text} \
                UNION ALL {} UNION ALL {} \
             ) c (hour, n) GROUP BY hour ORDER BY hour",
            base(p_from, p_whole_from),
            base(p_whole_to, p_to)
        );
        client.query_typed(&sql, &params).await?
    };
    let counts: Vec<(SystemTime, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let start = hour_floor(from);
    let mut out = Vec::new();
    let mut hour = start;
    while hour < to && out.len() < CHART_MAX_HOURS as usize {
        let n = counts
            .iter()
            .find(|(h, _)| *h == hour)
            .map_or(0, |(_, n)| *n);
        out.push((hour, n));
        hour += Duration::from_secs(3600);
    }
    Ok(out)
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

pub(crate) fn hour_floor(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    UNIX_EPOCH + Duration::from_secs(secs - secs % 3600)
}

/// The mark resets in `window` (its `from` and `to`), newest first (at most `limit`).
pub(crate) async fn fence_resets<C: GenericClient>(
    client: &C,
    window: &Filter,
    limit: usize,
) -> Result<Vec<FenceReset>, AuditError> {
    let rows = client
        .query(
            "SELECT id, at, resource, old_token, new_token, reason, actor, lock_key, lock_floor \
             FROM fence_reset WHERE ($2::timestamptz IS NULL OR at >= $2) \
             AND ($3::timestamptz IS NULL OR at < $3) ORDER BY at DESC, id LIMIT $1",
            &[&(limit as i64), &window.from, &window.to],
        )
        .await?;
    let token = |t: i64| FencingToken::try_from(t).unwrap_or(FencingToken::MIN);
    Ok(rows
        .iter()
        .map(|r| {
            let mut f = FenceReset::new(
                r.get::<_, String>(2),
                token(r.get(3)),
                token(r.get(4)),
                r.get::<_, String>(5),
                r.get::<_, String>(6),
            );
            f.id = r.get(0);
            f.at = r.get(1);
            if let (Some(lock), Some(floor)) =
                (r.get::<_, Option<String>>(7), r.get::<_, Option<i64>>(8))
            {
                f = f.with_lock(lock, token(floor));
            }
            f
        })
        .collect())
}

/// The forced releases in `window` (its `from` and `to`), newest first (at most `limit`).
pub(crate) async fn force_releases<C: GenericClient>(
    client: &C,
    window: &Filter,
    limit: usize,
) -> Result<Vec<ForceRelease>, AuditError> {
    let rows = client
        .query(
            "SELECT request_id, cluster_id, revision, lock_key, requester, approver, reason, class_was_fenced, at, \
             grant_rev, token FROM force_release WHERE ($2::timestamptz IS NULL OR at >= $2) \
             AND ($3::timestamptz IS NULL OR at < $3) ORDER BY at DESC, request_id LIMIT $1",
            &[&(limit as i64), &window.from, &window.to],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let mut f = ForceRelease::new(
                r.get::<_, String>(0),
                ClusterId::from_sql(r.get(1)),
                Revision::new(r.get::<_, i64>(2).max(0) as u64),
                r.get::<_, String>(3),
                r.get::<_, String>(4),
                r.get::<_, String>(5),
                r.get::<_, String>(6),
                r.get(7),
                r.get(8),
            );
            f.grant_rev = r
                .get::<_, Option<i64>>(9)
                .map(|g| Revision::new(g.max(0) as u64));
            f.token = r
                .get::<_, Option<i64>>(10)
                .and_then(|t| FencingToken::try_from(t).ok());
            f
        })
        .collect())
}
