-- Palisade audit schema, version 3: unprotected writes counted per hour.

-- The dashboard's chart counts unprotected writes per hour over up to two weeks, on every
-- page view. Counting write_event rows costs one index entry and heap visit per write
-- (about 30 ms for the 28,600 of a day at 1 million events); this table holds the counts
-- per hour and per (namespace, class, service, caller), the filters a chart can have but
-- `resource` (too many values to roll up; that filter reads write_event's own index).
-- Hours start on the hour in UTC. A counter that reaches 0 is deleted.
CREATE TABLE write_event_hourly (
    hour      timestamptz NOT NULL,
    namespace text,
    class     text,
    service   text        NOT NULL,
    caller    text,
    n         bigint      NOT NULL CHECK (n >= 0),
    CONSTRAINT write_event_hourly_key UNIQUE NULLS NOT DISTINCT (hour, namespace, class, service, caller)
);

-- Kept by the statement that inserts, updates, deletes or truncates write_event rows (statement-level
-- triggers over the transition tables), so the counts cannot disagree with the rows:
-- they commit or roll back together. Rows go in key order so concurrent inserts lock
-- the same counters in the same order.
CREATE FUNCTION write_event_hourly_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO write_event_hourly AS h (hour, namespace, class, service, caller, n)
    SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', namespace, class, service, caller, count(*)
    FROM new_rows WHERE outcome = 'unprotected'
    GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT ON CONSTRAINT write_event_hourly_key DO UPDATE SET n = h.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION write_event_hourly_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE write_event_hourly h SET n = h.n - gone.n
    FROM (SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, namespace, class, service,
                 caller, count(*) AS n
          FROM old_rows WHERE outcome = 'unprotected' GROUP BY 1, 2, 3, 4, 5) gone
    WHERE h.hour = gone.hour AND h.namespace IS NOT DISTINCT FROM gone.namespace
      AND h.class IS NOT DISTINCT FROM gone.class AND h.service = gone.service
      AND h.caller IS NOT DISTINCT FROM gone.caller;
    DELETE FROM write_event_hourly h
    WHERE h.n = 0 AND h.hour IN (
        SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM old_rows WHERE outcome = 'unprotected');
    RETURN NULL;
END $$;

CREATE FUNCTION write_event_hourly_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE write_event_hourly;
    RETURN NULL;
END $$;

-- No writer may insert between the back-fill below and the triggers (the lock is held
-- until this migration commits; writers wait, then fire the triggers).
LOCK TABLE write_event IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER write_event_hourly_insert AFTER INSERT ON write_event
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_hourly_add();
CREATE TRIGGER write_event_hourly_delete AFTER DELETE ON write_event
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_hourly_remove();
CREATE TRIGGER write_event_hourly_update_old AFTER UPDATE ON write_event
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_hourly_remove();
CREATE TRIGGER write_event_hourly_update_new AFTER UPDATE ON write_event
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION write_event_hourly_add();
CREATE TRIGGER write_event_hourly_truncate AFTER TRUNCATE ON write_event
    FOR EACH STATEMENT EXECUTE FUNCTION write_event_hourly_clear();

-- Back-fill from the rows already stored.
INSERT INTO write_event_hourly (hour, namespace, class, service, caller, n)
SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', namespace, class, service, caller, count(*)
FROM write_event WHERE outcome = 'unprotected'
GROUP BY 1, 2, 3, 4, 5;
