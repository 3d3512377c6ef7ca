-- Palisade audit schema, version 10: the overview's counts over whole days and by finding.

-- The overview counts a range of up to two weeks on every view. Over 7 days the hourly
-- counters are 168 hours of every (namespace, class, service, caller, finding), and the
-- top resources were every unprotected row of the range (200,000 at 1 million events).
-- Three more counter tables, kept like write_event_hourly (by statement-level triggers
-- over the transition tables, in the statement that changes the rows, so they commit or
-- roll back with them; a counter that reaches 0 is deleted; days and hours start at
-- midnight and on the hour in UTC):
--   write_event_daily: unprotected writes per day and per (namespace, class, service,
--     caller, finding), the hourly counters' keys, for the whole days of a range;
--   write_event_daily_resource: unprotected writes per day and per resource, for the
--     whole days of a range (a day holds at most one counter per resource written);
--   write_event_hourly_finding: unprotected and refused writes per hour and per finding
--     alone, for the stacked chart, the totals and the refused counts.
CREATE TABLE write_event_daily (
    day       timestamptz NOT NULL,
    namespace text,
    class     text,
    service   text        NOT NULL,
    caller    text,
    finding   text,
    n         bigint      NOT NULL CHECK (n >= 0),
    CONSTRAINT write_event_daily_key
        UNIQUE NULLS NOT DISTINCT (day, namespace, class, service, caller, finding)
);

CREATE TABLE write_event_daily_resource (
    day      timestamptz NOT NULL,
    resource text,
    n        bigint      NOT NULL CHECK (n >= 0),
    CONSTRAINT write_event_daily_resource_key UNIQUE NULLS NOT DISTINCT (day, resource) INCLUDE (n)
);

CREATE TABLE write_event_hourly_finding (
    hour    timestamptz NOT NULL,
    outcome text        NOT NULL CHECK (outcome IN ('unprotected', 'rejected')),
    finding text,
    n       bigint      NOT NULL CHECK (n >= 0),
    CONSTRAINT write_event_hourly_finding_key UNIQUE NULLS NOT DISTINCT (hour, outcome, finding) INCLUDE (n)
);

-- Rows go in key order, and the tables in this order, so concurrent statements lock the
-- same counters in the same order.
CREATE FUNCTION write_event_rollup_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO write_event_daily AS d (day, namespace, class, service, caller, finding, n)
    SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', namespace, class, service, caller,
           finding, count(*)
    FROM new_rows WHERE outcome = 'unprotected'
    GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT ON CONSTRAINT write_event_daily_key DO UPDATE SET n = d.n + EXCLUDED.n;
    INSERT INTO write_event_daily_resource AS d (day, resource, n)
    SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', resource, count(*)
    FROM new_rows WHERE outcome = 'unprotected'
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT ON CONSTRAINT write_event_daily_resource_key DO UPDATE SET n = d.n + EXCLUDED.n;
    INSERT INTO write_event_hourly_finding AS h (hour, outcome, finding, n)
    SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', outcome, finding, count(*)
    FROM new_rows WHERE outcome IN ('unprotected', 'rejected')
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT write_event_hourly_finding_key DO UPDATE SET n = h.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION write_event_rollup_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE write_event_daily d SET n = d.n - gone.n
    FROM (SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day, namespace, class, service,
                 caller, finding, count(*) AS n
          FROM old_rows WHERE outcome = 'unprotected' GROUP BY 1, 2, 3, 4, 5, 6) gone
    WHERE d.day = gone.day AND d.namespace IS NOT DISTINCT FROM gone.namespace
      AND d.class IS NOT DISTINCT FROM gone.class AND d.service = gone.service
      AND d.caller IS NOT DISTINCT FROM gone.caller AND d.finding IS NOT DISTINCT FROM gone.finding;
    DELETE FROM write_event_daily d
    WHERE d.n = 0 AND d.day IN (
        SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM old_rows WHERE outcome = 'unprotected');

    UPDATE write_event_daily_resource d SET n = d.n - gone.n
    FROM (SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS day, resource, count(*) AS n
          FROM old_rows WHERE outcome = 'unprotected' GROUP BY 1, 2) gone
    WHERE d.day = gone.day AND d.resource IS NOT DISTINCT FROM gone.resource;
    DELETE FROM write_event_daily_resource d
    WHERE d.n = 0 AND d.day IN (
        SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM old_rows WHERE outcome = 'unprotected');

    UPDATE write_event_hourly_finding h SET n = h.n - gone.n
    FROM (SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, outcome, finding,
                 count(*) AS n
          FROM old_rows WHERE outcome IN ('unprotected', 'rejected') GROUP BY 1, 2, 3) gone
    WHERE h.hour = gone.hour AND h.outcome = gone.outcome AND h.finding IS NOT DISTINCT FROM gone.finding;
    DELETE FROM write_event_hourly_finding h
    WHERE h.n = 0 AND h.hour IN (
        SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM old_rows
        WHERE outcome IN ('unprotected', 'rejected'));
    RETURN NULL;
END $$;

CREATE FUNCTION write_event_rollup_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE write_event_daily, write_event_daily_resource, write_event_hourly_finding;
    RETURN NULL;
END $$;

-- No writer may insert between the back-fill below and the triggers (the lock is held
-- until this migration commits; writers wait, then fire the triggers).
LOCK TABLE write_event IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER write_event_rollup_insert AFTER INSERT ON write_event
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_rollup_add();
CREATE TRIGGER write_event_rollup_delete AFTER DELETE ON write_event
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_rollup_remove();
CREATE TRIGGER write_event_rollup_update_old AFTER UPDATE ON write_event
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_rollup_remove();
CREATE TRIGGER write_event_rollup_update_new AFTER UPDATE ON write_event
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_rollup_add();
CREATE TRIGGER write_event_rollup_truncate AFTER TRUNCATE ON write_event
    FOR EACH STATEMENT EXECUTE FUNCTION write_event_rollup_clear();

-- Back-fill from the rows already stored.
INSERT INTO write_event_daily (day, namespace, class, service, caller, finding, n)
SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', namespace, class, service, caller, finding, count(*)
FROM write_event WHERE outcome = 'unprotected'
GROUP BY 1, 2, 3, 4, 5, 6;
INSERT INTO write_event_daily_resource (day, resource, n)
SELECT date_trunc('day', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', resource, count(*)
FROM write_event WHERE outcome = 'unprotected'
GROUP BY 1, 2;
INSERT INTO write_event_hourly_finding (hour, outcome, finding, n)
SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', outcome, finding, count(*)
FROM write_event WHERE outcome IN ('unprotected', 'rejected')
GROUP BY 1, 2, 3;
