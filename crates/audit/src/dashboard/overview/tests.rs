use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{day_spans, spans, trend, Source::*, TOP_RESOURCES, TOTAL};

/// A UTC midnight, plus `h` hours, `m` minutes.
fn t(h: u64, m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 86_400 * 86_400 + h * 3600 + m * 60)
}

#[test]
fn a_range_is_cut_into_whole_days_whole_hours_and_rows() {
    // 7 days from 18:31 to 18:31: rows to 19:00, hours to midnight, 6 whole days,
    // hours to 18:00, rows to 18:31.
    assert_eq!(
        spans(t(18, 31), t(7 * 24 + 18, 31), true, true),
        [
            (Row, t(18, 31), t(19, 0)),
            (Hour, t(19, 0), t(24, 0)),
            (Day, t(24, 0), t(7 * 24, 0)),
            (Hour, t(7 * 24, 0), t(7 * 24 + 18, 0)),
            (Row, t(7 * 24 + 18, 0), t(7 * 24 + 18, 31)),
        ]
    );
    // 24 hours hold no whole day: the hours on either side of midnight are one span.
    assert_eq!(
        spans(t(18, 31), t(24 + 18, 31), true, true),
        [
            (Row, t(18, 31), t(19, 0)),
            (Hour, t(19, 0), t(24 + 18, 0)),
            (Row, t(24 + 18, 0), t(24 + 18, 31)),
        ]
    );
    // Without hourly counters the partial days are rows.
    assert_eq!(
        spans(t(18, 31), t(3 * 24 + 2, 5), true, false),
        [
            (Row, t(18, 31), t(24, 0)),
            (Day, t(24, 0), t(3 * 24, 0)),
            (Row, t(3 * 24, 0), t(3 * 24 + 2, 5)),
        ]
    );
    assert_eq!(
        spans(t(18, 31), t(24 + 18, 31), true, false),
        [(Row, t(18, 31), t(24 + 18, 31))]
    );
    // Bounds on the units need no rows; a range inside one hour is rows alone.
    assert_eq!(
        spans(t(0, 0), t(48, 0), true, true),
        [(Day, t(0, 0), t(48, 0))]
    );
    assert_eq!(
        spans(t(1, 0), t(5, 0), false, true),
        [(Hour, t(1, 0), t(5, 0))]
    );
    assert_eq!(
        spans(t(1, 10), t(1, 50), true, true),
        [(Row, t(1, 10), t(1, 50))]
    );
    assert_eq!(spans(t(2, 0), t(1, 0), true, true), []);
}

#[test]
fn an_end_is_subtracted_from_its_whole_day_when_fewer_rows_are_read() {
    // 24 hours to 18:31 now: 5 h 29 min of rows from the start to midnight, then
    // today's counters less today's rows after now (none yet).
    let now = t(24 + 18, 31);
    assert_eq!(
        day_spans(t(18, 31), now, now),
        [
            (Row, t(18, 31), t(24, 0), 1),
            (Day, t(24, 0), t(48, 0), 1),
            (Row, now, t(48, 0), -1),
        ]
    );
    // A start at 03:00: its day less the 3 hours before it.
    assert_eq!(
        day_spans(t(3, 0), t(3 * 24 + 1, 0), t(9 * 24, 0)),
        [
            (Row, t(0, 0), t(3, 0), -1),
            (Day, t(0, 0), t(3 * 24, 0), 1),
            (Row, t(3 * 24, 0), t(3 * 24 + 1, 0), 1),
        ]
    );
    // Inside one day, in the past: the rows alone.
    assert_eq!(
        day_spans(t(9, 0), t(15, 0), t(9 * 24, 0)),
        [(Row, t(9, 0), t(15, 0), 1)]
    );
    assert_eq!(
        day_spans(t(0, 0), t(48, 0), t(48, 0)),
        [(Day, t(0, 0), t(48, 0), 1)]
    );
    assert_eq!(day_spans(t(5, 0), t(5, 0), t(48, 0)), []);
}

#[test]
fn each_span_reads_its_source_with_its_own_bounds() {
    let now = t(9 * 24, 0);
    let (sql, params) = TOP_RESOURCES.sql(t(18, 31), t(3 * 24 + 2, 5), now);
    assert_eq!(
        params,
        [
            t(18, 31),
            t(24, 0),
            t(24, 0),
            t(3 * 24, 0),
            t(3 * 24, 0),
            t(3 * 24 + 2, 5)
        ]
    );
    assert!(sql.contains("FROM write_event_daily_resource WHERE day >= $3 AND day < $4"));
    assert!(sql.contains("AND at >= $5 AND at < $6 GROUP BY resource"));
    assert!(
        sql.ends_with("HAVING sum(n) > 0 ORDER BY n DESC, k LIMIT 10"),
        "{sql}"
    );
    // Ending now, the last day is read whole less the rows after now.
    let (sql, params) = TOP_RESOURCES.sql(t(18, 31), t(3 * 24 + 2, 5), t(3 * 24 + 2, 5));
    assert_eq!(params[4..], [t(3 * 24 + 2, 5), t(4 * 24, 0)]);
    assert!(
        sql.contains("SELECT resource, -count(*) FROM write_event"),
        "{sql}"
    );
    assert!(sql.contains("WHERE day >= $3 AND day < $4"), "{sql}");
    let (sql, params) = TOTAL.sql(t(1, 10), t(1, 50), now);
    assert_eq!(params.len(), 2);
    assert!(!sql.contains("GROUP BY NULL"), "{sql}");
    assert!(!sql.contains("hourly"), "{sql}");
}

#[test]
fn trend_is_the_rounded_percent_change_and_none_without_a_base() {
    assert_eq!(trend(150, 100), Some(50));
    assert_eq!(trend(1, 3), Some(-67));
    assert_eq!(trend(5, 0), None);
    assert_eq!(trend(0, 4), Some(-100));
}
