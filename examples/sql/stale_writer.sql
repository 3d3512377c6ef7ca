-- A fenced write from plain SQL, as any language can send it (run with psql after the
-- fence migrations, see docs/sql-api.md):
--
--   psql -X -v ON_ERROR_STOP=1 -f examples/sql/stale_writer.sql "$DATABASE_URL"
--
-- Writer A holds the lock with token 1000 and writes; A pauses, its lease expires, and
-- writer B is granted token 2000 and writes; then A wakes up and writes with 1000. The
-- raise refuses A's token (SQLSTATE PF001), which aborts A's transaction, so its UPDATE
-- does nothing and its COMMIT ends as a ROLLBACK.
--
-- The calls name the fence's schema, palisade_fence, so that no function of the same name
-- in another schema is ever reached. Deleting the example's mark first (so that it can run
-- again) takes the fence's owner; a writer holds only EXECUTE on the raise functions
-- (docs/sql-api.md, Privileges).

\set VERBOSITY verbose
CREATE TABLE IF NOT EXISTS example_account (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO example_account VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET balance = 0;
DELETE FROM palisade_fence.fence_high_water WHERE resource = 'example-account/1';

-- A, token 1000.
BEGIN;
SELECT palisade_fence.fence_raise_or_abort('example-account/1', 1000) AS a_admitted;
UPDATE example_account SET balance = balance + 10 WHERE id = 1;
COMMIT;

-- B, token 2000.
BEGIN;
SELECT palisade_fence.fence_raise_or_abort('example-account/1', 2000) AS b_admitted;
UPDATE example_account SET balance = balance + 20 WHERE id = 1;
COMMIT;

-- A again, stale: the raise fails with PF001 and the rest of the transaction with it.
\set ON_ERROR_STOP 0
BEGIN;
SELECT palisade_fence.fence_raise_or_abort('example-account/1', 1000) AS a_again;
UPDATE example_account SET balance = balance + 1000 WHERE id = 1;
COMMIT;
\set ON_ERROR_STOP 1

-- fence_raise (without _or_abort) answers instead of failing: the mark, here 2000,
-- which is not A's token, so A must roll back by itself.
BEGIN;
SELECT palisade_fence.fence_raise('example-account/1', 1000) AS mark_seen_by_a;
ROLLBACK;

-- Only A's first write and B's landed.
SELECT balance FROM example_account WHERE id = 1;
DO $$
BEGIN
    IF (SELECT balance FROM example_account WHERE id = 1) <> 30 THEN
        RAISE EXCEPTION 'the stale write landed';
    END IF;
    IF (SELECT token FROM palisade_fence.fence_high_water WHERE resource = 'example-account/1') <> 2000 THEN
        RAISE EXCEPTION 'the mark is not B''s token';
    END IF;
END
$$;
