-- palisade-fence: the raise as two functions. PL/pgSQL keeps the plans of their
-- statements per connection, so a caller sends one short statement and nothing is
-- planned on each call. Idempotent (CREATE OR REPLACE).
--
-- fence_raise(resource, token) returns the resource's mark as this transaction leaves it:
-- `token` when the token is admitted, the higher mark when it is refused. An admitted
-- transaction holds a transaction-scoped advisory lock on the resource until it ends,
-- keyed (1885432937, hashtext(resource)):
--   - a token equal to the mark holds it shared: no write, no WAL, and several
--     transactions with that token hold it at once;
--   - a newer token (or a resource's first) holds it exclusive, and only then upserts
--     the row.
-- So a raise waits for every transaction in flight that was admitted with an equal or
-- older token, and a shared request that arrives while a raise holds or waits for the
-- lock queues behind it (the lock manager serves conflicting requests in order) and then
-- reads the mark the raise committed. Two resources whose hashes collide only wait for
-- each other more often. The mark row is written only under the exclusive lock: every
-- writer of marks must raise through fence_raise (an earlier version of this crate, which
-- upserted without the lock, must not write the same database at the same time).
--
-- Under REPEATABLE READ or SERIALIZABLE a read cannot see a mark committed after the
-- transaction's snapshot, so there every token takes the exclusive lock and upserts the
-- row; a mark newer than the snapshot then fails as a serialization failure (40001), and
-- so does a second transaction with the same token whose snapshot predates the first's
-- rewrite of the row (writers with one token serialize there; one of them retries).
--
-- The functions keep the search_path they were created with (the schema the mark table
-- was created in by the same migration, then pg_temp), so a caller's search_path, or a
-- temporary table of the same name, cannot point them at another table. CREATE OR REPLACE needs the
-- caller to own a function: a role that shares the schema but does not own the functions
-- finds them in place and leaves them alone (their owner brings them up to date).
DO $migration$
BEGIN
IF EXISTS (
    SELECT 1 FROM pg_proc p
    WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
      AND p.proname IN ('fence_raise', 'fence_raise_or_abort')
      AND NOT pg_has_role(current_user, p.proowner, 'USAGE')
) THEN
    RETURN;
END IF;
-- What the functions keep as their search_path (SET ... FROM CURRENT, below): the schema
-- the table is in, then pg_temp last, so no temporary table is looked up first.
PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);

CREATE OR REPLACE FUNCTION fence_raise(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SET search_path FROM CURRENT AS $$
DECLARE
    key int4 := hashtext(p_resource);
    mark bigint;
BEGIN
    -- An unlocked read picks the lock mode: a shared lock upgraded to exclusive would
    -- deadlock two raisers of one resource.
    SELECT token INTO mark FROM fence_high_water WHERE resource = p_resource;
    IF mark > p_token THEN
        RETURN mark;
    END IF;
    IF mark = p_token AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pg_advisory_xact_lock_shared(1885432937, key);
        -- A new snapshot: sees any raise that committed before the lock was granted.
        SELECT token INTO mark FROM fence_high_water WHERE resource = p_resource;
        IF mark >= p_token THEN
            RETURN mark;
        END IF;
        -- Lowered or deleted by hand meanwhile: raise it below.
    END IF;
    PERFORM pg_advisory_xact_lock(1885432937, key);
    INSERT INTO fence_high_water AS h (resource, token, updated_at) VALUES (p_resource, p_token, now())
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
        WHERE h.token <= EXCLUDED.token;
    IF FOUND THEN
        RETURN p_token;
    END IF;
    -- Refused by a higher mark committed since the first read; the upsert locked the row.
    SELECT token INTO mark FROM fence_high_water WHERE resource = p_resource;
    RETURN mark;
END
$$;

-- fence_raise_or_abort(resource, token): fence_raise, but a refused token raises
-- SQLSTATE PF001, which aborts the transaction, so the statements pipelined after it do
-- nothing. Not STRICT: a NULL resource or token raises 22004 (and so aborts) rather than
-- returning NULL and letting the rest run.
CREATE OR REPLACE FUNCTION fence_raise_or_abort(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    mark bigint;
BEGIN
    IF p_resource IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'fence_raise_or_abort: the resource and the token must not be NULL'
            USING ERRCODE = '22004';
    END IF;
    mark := fence_raise(p_resource, p_token);
    IF mark IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'stale fencing token % for resource %: the mark is %', p_token, p_resource, mark
            USING ERRCODE = 'PF001';
    END IF;
    RETURN mark;
END
$$;
END
$migration$;
