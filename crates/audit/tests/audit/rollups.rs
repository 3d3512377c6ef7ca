//! The overview's counters (schema version 10): back-filled by their migration, kept equal
//! to the rows by every insert, update, delete and truncate, and the overview's numbers
//! over any window equal to counting the rows.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use palisade_audit::{insert_writes, Finding, Labels, Outcome, WriteRecord};
use palisade_testkit::TestDb;
use serde_json::Value;

use crate::common::{count, get, migrated_db};

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// The hour bucket of `at`, as the counters key it.
const HOUR_OF: &str = "date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'";
/// The day bucket of `at`.
const DAY_OF: &str = "date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'";

/// Rows of the counter table `table` (columns `keys`, `n`) that differ, either way, from
/// counting the `write_event` rows matching `rows` by `counted` (the same keys).
async fn disagreements(
    client: &tokio_postgres::Client,
    table: &str,
    keys: &str,
    counted: &str,
    rows: &str,
) -> i64 {
    let groups = (1..=keys.split(',').count())
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    count(
        client,
        &format!(
            "WITH counted AS (SELECT {counted}, count(*) AS n FROM write_event WHERE {rows} GROUP BY {groups}), \
             kept AS (SELECT {keys}, n FROM {table}) \
             SELECT count(*) FROM ((SELECT * FROM counted EXCEPT ALL SELECT * FROM kept) \
                                   UNION ALL (SELECT * FROM kept EXCEPT ALL SELECT * FROM counted)) d"
        ),
    )
    .await
}

/// The disagreements of the three counter tables of version 10, in order: daily,
/// daily by resource, hourly by finding.
async fn all_disagreements(client: &tokio_postgres::Client) -> [i64; 3] {
    let unprotected = "outcome = 'unprotected'";
    [
        disagreements(
            client,
            "write_event_daily",
            "day, namespace, class, service, caller, finding",
            &format!("{DAY_OF}, namespace, class, service, caller, finding"),
            unprotected,
        )
        .await,
        disagreements(
            client,
            "write_event_daily_resource",
            "day, resource",
            &format!("{DAY_OF}, resource"),
            unprotected,
        )
        .await,
        disagreements(
            client,
            "write_event_hourly_finding",
            "hour, outcome, finding",
            &format!("{HOUR_OF}, outcome, finding"),
            "outcome IN ('unprotected', 'rejected')",
        )
        .await,
    ]
}

async fn sums(client: &tokio_postgres::Client) -> [i64; 3] {
    let mut out = [0; 3];
    for (i, table) in [
        "write_event_daily",
        "write_event_daily_resource",
        "write_event_hourly_finding",
    ]
    .iter()
    .enumerate()
    {
        out[i] = count(
            client,
            &format!("SELECT coalesce(sum(n), 0)::bigint FROM {table}"),
        )
        .await;
    }
    out
}

fn write(
    at: SystemTime,
    outcome: Outcome,
    finding: Finding,
    service: &str,
    resource: &str,
) -> WriteRecord {
    let mut r = WriteRecord::new(service, resource, "PUT", outcome, finding, at);
    r.caller = Some(format!("spiffe://td/{service}"));
    r.labels = Labels::new("ns", "rows");
    r
}

/// Migration 10 back-fills its counters from the rows already stored, and from then on
/// every insert (replays too), rolled-back insert, update, delete and truncate keeps
/// them equal to counting the rows.
#[tokio::test]
async fn overview_counters_are_back_filled_and_kept_with_the_rows() {
    use Finding::*;
    use Outcome::*;
    let db = TestDb::create().await;
    let mut client = db.connect().await;
    // The schema as it was before version 10, with rows in it.
    for (version, name, sql) in &palisade_audit::MIGRATIONS[..9] {
        client.batch_execute(sql).await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS audit_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, \
                 applied_at timestamptz NOT NULL DEFAULT now()); \
                 INSERT INTO audit_schema_migrations (version, name) VALUES ({version}, '{name}')"
            ))
            .await
            .unwrap();
    }
    // A day boundary in UTC, and minutes around it.
    let midnight = UNIX_EPOCH + Duration::from_secs(1_800_000_000 / DAY * DAY);
    let min = |m: i64| {
        if m >= 0 {
            midnight + Duration::from_secs(60 * m as u64)
        } else {
            midnight - Duration::from_secs(60 * (-m) as u64)
        }
    };
    let old = vec![
        write(min(-90), Unprotected, MissingToken, "a", "/r/1"),
        write(min(-80), Unprotected, MissingToken, "a", "/r/1"),
        write(min(-10), Unprotected, Stale, "a", "/r/2"),
        write(min(5), Unprotected, MissingToken, "b", "/r/1"),
        write(min(6), Rejected, Stale, "b", "/r/1"),
        write(min(7), Admitted, Current, "b", "/r/1"),
    ];
    let dropped = WriteRecord::dropped("a", 5);
    insert_writes(&client, &[old.clone(), vec![dropped]].concat())
        .await
        .unwrap();
    assert_eq!(
        palisade_audit::migrate_client(&mut client).await.unwrap(),
        [10, 11]
    );
    assert_eq!(all_disagreements(&client).await, [0, 0, 0]);
    // Four unprotected writes over two days, one refused, nothing else.
    assert_eq!(sums(&client).await, [4, 4, 5]);
    let day_before: i64 = client
        .query_one(
            &format!(
                "SELECT n FROM write_event_daily_resource WHERE resource = '/r/1' \
                 AND day = (SELECT {DAY_OF} FROM (SELECT $1::timestamptz AS at) t)"
            ),
            &[&min(-90)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(day_before, 2, "/r/1 twice the day before midnight");

    // New rows, and a replay of old ones that inserts nothing.
    let new = vec![
        write(min(-70), Unprotected, MalformedToken, "c", "/r/3"),
        write(min(20), Rejected, MissingToken, "c", "/r/3"),
    ];
    assert_eq!(
        insert_writes(&client, &[new, old].concat()).await.unwrap(),
        2
    );
    assert_eq!(all_disagreements(&client).await, [0, 0, 0]);
    assert_eq!(sums(&client).await, [5, 5, 7]);
    // A rolled-back insert leaves no count behind.
    client.batch_execute("BEGIN").await.unwrap();
    insert_writes(&client, &[write(min(1), Unprotected, Stale, "a", "/r/1")])
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(sums(&client).await, [5, 5, 7]);
    // Updates move counts across days, resources, findings and outcomes.
    client
        .batch_execute(
            "UPDATE write_event SET at = at + interval '1 day', resource = '/r/9' WHERE service = 'a'; \
             UPDATE write_event SET finding = 'stale' WHERE service = 'b'; \
             UPDATE write_event SET outcome = 'admitted', finding = 'current' WHERE service = 'c'",
        )
        .await
        .unwrap();
    assert_eq!(all_disagreements(&client).await, [0, 0, 0]);
    assert_eq!(sums(&client).await, [4, 4, 5]);
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM write_event_daily_resource WHERE resource IN ('/r/2', '/r/3')"
        )
        .await,
        0,
        "emptied counters are gone"
    );
    client
        .batch_execute("DELETE FROM write_event WHERE service = 'b'")
        .await
        .unwrap();
    assert_eq!(all_disagreements(&client).await, [0, 0, 0]);
    assert_eq!(sums(&client).await, [3, 3, 3]);
    client.batch_execute("TRUNCATE write_event").await.unwrap();
    assert_eq!(sums(&client).await, [0, 0, 0]);
    for table in [
        "write_event_daily",
        "write_event_daily_resource",
        "write_event_hourly_finding",
    ] {
        assert_eq!(
            count(&client, &format!("SELECT count(*) FROM {table}")).await,
            0,
            "{table}"
        );
    }
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `(name, count)` of a top list in the overview's JSON.
fn tops(v: &Value, list: &str) -> Vec<(Option<String>, i64)> {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} in {v}"))
        .iter()
        .map(|t| {
            (
                t["name"].as_str().map(str::to_owned),
                t["count"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The overview over windows that start and end inside hours and days (so each reads
/// daily counters, hourly counters and rows) gives the numbers of counting the rows.
#[tokio::test]
async fn overview_numbers_over_any_window_are_the_rows_counted() {
    let (_db, pool) = migrated_db().await;
    let now = SystemTime::now();
    let now_secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
    // A fixed pseudo-random spread over the last 16 days.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |m: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % m
    };
    let findings = [
        Finding::MissingToken,
        Finding::MalformedToken,
        Finding::Stale,
    ];
    let rows: Vec<WriteRecord> = (0..3000)
        .map(|_| {
            let at = UNIX_EPOCH + Duration::from_secs(now_secs - next(16 * DAY));
            let (outcome, finding) = match next(10) {
                0..=5 => (Outcome::Unprotected, findings[next(3) as usize]),
                6 => (Outcome::Rejected, findings[next(3) as usize]),
                _ => (Outcome::Admitted, Finding::Current),
            };
            let mut r = write(
                at,
                outcome,
                finding,
                &format!("svc-{}", next(7)),
                &format!("/r/{}", next(40)),
            );
            r.caller = (next(6) > 0).then(|| format!("caller-{}", next(5)));
            r
        })
        .collect();
    let client = pool.get().await.unwrap();
    insert_writes(&**client, &rows).await.unwrap();
    let app = palisade_audit::dashboard::router(pool.clone());

    // Whole seconds, 17 minutes and 13 seconds past some hour.
    let to = UNIX_EPOCH + Duration::from_secs(now_secs / HOUR * HOUR - HOUR + 17 * 60 + 13);
    for length in [
        HOUR / 2,
        HOUR,
        6 * HOUR,
        DAY,
        3 * DAY + 1234,
        7 * DAY,
        14 * DAY,
    ] {
        let from = to - Duration::from_secs(length);
        let url = format!(
            "/api/overview?from={}&to={}",
            humantime::format_rfc3339_seconds(from),
            humantime::format_rfc3339_seconds(to)
        );
        let got = json(&get(&app, &url).await.body);
        let n = |f: SystemTime, t: SystemTime, outcome: &'static str| {
            let client = &client;
            async move {
                client
                    .query_one(
                        "SELECT count(*) FROM write_event WHERE outcome = $1 AND at >= $2 AND at < $3",
                        &[&outcome, &f, &t],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
            }
        };
        let day = Duration::from_secs(DAY);
        let week = Duration::from_secs(7 * DAY);
        assert_eq!(
            got["unprotected"],
            n(from, to, "unprotected").await,
            "{url}"
        );
        assert_eq!(
            got["unprotected_24h"],
            n(to - day, to, "unprotected").await,
            "{url}"
        );
        assert_eq!(
            got["unprotected_7d"],
            n(to - week, to, "unprotected").await,
            "{url}"
        );
        assert_eq!(
            got["unprotected_prev_7d"],
            n(to - 2 * week, to - week, "unprotected").await,
            "{url}"
        );
        for finding in ["missing_token", "malformed_token", "stale"] {
            let want: i64 = client
                .query_one(
                    "SELECT count(*) FROM write_event WHERE outcome = 'rejected' AND finding = $1 \
                     AND at >= $2 AND at < $3",
                    &[&finding, &from, &to],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(got["refused"][finding], want, "{finding} refused, {url}");
        }
        for (list, column) in [
            ("top_callers", "caller"),
            ("top_services", "service"),
            ("top_resources", "resource"),
        ] {
            let want: Vec<(Option<String>, i64)> = client
                .query(
                    &format!(
                        "SELECT {column}, count(*) FROM write_event WHERE outcome = 'unprotected' \
                         AND at >= $1 AND at < $2 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10"
                    ),
                    &[&from, &to],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            assert!(!want.is_empty(), "{list}: rows in {url}");
            assert_eq!(tops(&got, list), want, "{list}, {url}");
        }
    }
}
