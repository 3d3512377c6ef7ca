-- Palisade audit schema, version 7: what the overview page counts on every view.

-- The hourly counts of unprotected writes gain the finding (missing_token, malformed_token,
-- stale, store_unavailable), so the overview's chart stacks hours by finding from the
-- counters instead of the rows. The filters of the existing reads sum over it.
LOCK TABLE write_event IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE write_event_hourly ADD COLUMN finding text;
ALTER TABLE write_event_hourly DROP CONSTRAINT write_event_hourly_key;
TRUNCATE write_event_hourly;
ALTER TABLE write_event_hourly ADD CONSTRAINT write_event_hourly_key
    UNIQUE NULLS NOT DISTINCT (hour, namespace, class, service, caller, finding);

CREATE OR REPLACE FUNCTION write_event_hourly_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO write_event_hourly AS h (hour, namespace, class, service, caller, finding, n)
    SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', namespace, class, service, caller, finding,
           count(*)
    FROM new_rows WHERE outcome = 'unprotected'
    GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT ON CONSTRAINT write_event_hourly_key DO UPDATE SET n = h.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION write_event_hourly_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE write_event_hourly h SET n = h.n - gone.n
    FROM (SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, namespace, class, service,
                 caller, finding, count(*) AS n
          FROM old_rows WHERE outcome = 'unprotected' GROUP BY 1, 2, 3, 4, 5, 6) gone
    WHERE h.hour = gone.hour AND h.namespace IS NOT DISTINCT FROM gone.namespace
      AND h.class IS NOT DISTINCT FROM gone.class AND h.service = gone.service
      AND h.caller IS NOT DISTINCT FROM gone.caller AND h.finding IS NOT DISTINCT FROM gone.finding;
    DELETE FROM write_event_hourly h
    WHERE h.n = 0 AND h.hour IN (
        SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM old_rows WHERE outcome = 'unprotected');
    RETURN NULL;
END $$;

INSERT INTO write_event_hourly (hour, namespace, class, service, caller, finding, n)
SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', namespace, class, service, caller, finding, count(*)
FROM write_event WHERE outcome = 'unprotected'
GROUP BY 1, 2, 3, 4, 5, 6;

-- Refused writes (the fence layer's refusals) and the counts of dropped events, newest
-- first: the refused-writes page and the overview's tiles read them by time.
CREATE INDEX write_event_rejected_at ON write_event (at DESC, id DESC) WHERE outcome = 'rejected';
CREATE INDEX write_event_dropped_at ON write_event (at DESC) WHERE outcome = 'dropped';

-- Gaps by cluster and revision: the timeline places them among a key's events.
CREATE INDEX audit_event_gap ON audit_event (cluster_id, revision) WHERE type = 'gap';

-- Lock keys by name, for the timeline's suggestions and its `ns/class/key` form.
CREATE INDEX audit_event_ns_class_key ON audit_event (namespace, class, lock_key, revision DESC)
    WHERE lock_key IS NOT NULL;

-- The most recently granted keys, offered by the timeline's key field.
CREATE INDEX audit_event_grant_revision ON audit_event (revision DESC) WHERE type = 'grant';
