-- palisade-fence: fence_raise and fence_raise_or_abort again, with what they do unchanged
-- (see 0002 for the rule) and cheaper calls. Idempotent (CREATE OR REPLACE); the same
-- ownership rule as 0002. Replaces 0002's functions in a database that ran it.
--
-- The functions name every table, function and operator by its schema instead of
-- carrying a search_path (0002's `SET search_path FROM CURRENT`): the mark table is the
-- one in the schema this migration runs in (`current_schema()`, written into the bodies
-- when they are created, below), and the rest is `pg_catalog`'s. So a caller's
-- search_path, a temporary table of the same name, or a same-named function or operator
-- in a schema the caller searches first, cannot point them elsewhere, as with 0002. A
-- function with a SET clause costs a configuration change and its undoing on every call
-- (the search path is looked up again each time); these have none.
--
-- fence_raise_or_abort decides on its own rather than calling fence_raise (one PL/pgSQL
-- call per raise instead of two), with the same steps and answers. A newer token updates
-- the existing mark row with a plain UPDATE under the exclusive lock, and upserts only when
-- there is no row (a resource's first token, or a row deleted by hand): the upsert locks
-- the row before updating it, one more write than the UPDATE.
--
-- The bodies are built with format(): `%1$I` is the schema, quoted as an identifier, and
-- `%%` a literal `%` (the placeholders of RAISE's messages).
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

EXECUTE format($create$
CREATE OR REPLACE FUNCTION %1$I.fence_raise(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $body$
DECLARE
    mark bigint;
BEGIN
    -- An unlocked read picks the lock mode: a shared lock upgraded to exclusive would
    -- deadlock two raisers of one resource.
    SELECT h.token INTO mark FROM %1$I.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    IF mark OPERATOR(pg_catalog.>) p_token THEN
        RETURN mark;
    END IF;
    IF mark OPERATOR(pg_catalog.=) p_token
        AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885432937, pg_catalog.hashtext(p_resource));
        -- A new snapshot: sees any raise that committed before the lock was granted.
        SELECT h.token INTO mark FROM %1$I.fence_high_water h
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
        IF mark OPERATOR(pg_catalog.>=) p_token THEN
            RETURN mark;
        END IF;
        -- Lowered or deleted by hand meanwhile: raise it below.
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(1885432937, pg_catalog.hashtext(p_resource));
    IF mark IS NOT NULL THEN
        UPDATE %1$I.fence_high_water h SET token = p_token, updated_at = pg_catalog.now()
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource
              AND h.token OPERATOR(pg_catalog.<=) p_token;
        IF FOUND THEN
            RETURN p_token;
        END IF;
    END IF;
    INSERT INTO %1$I.fence_high_water AS h (resource, token, updated_at)
        VALUES (p_resource, p_token, pg_catalog.now())
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = pg_catalog.now()
        WHERE h.token OPERATOR(pg_catalog.<=) EXCLUDED.token;
    IF FOUND THEN
        RETURN p_token;
    END IF;
    -- Refused by a higher mark committed since the first read; the upsert locked the row.
    SELECT h.token INTO mark FROM %1$I.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    RETURN mark;
END
$body$
$create$, current_schema());

-- fence_raise_or_abort: fence_raise's steps, but each refusal raises PF001 (aborting the
-- transaction) instead of returning the mark, and a NULL argument raises 22004.
EXECUTE format($create$
CREATE OR REPLACE FUNCTION %1$I.fence_raise_or_abort(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $body$
DECLARE
    mark bigint;
BEGIN
    IF p_resource IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'fence_raise_or_abort: the resource and the token must not be NULL'
            USING ERRCODE = '22004';
    END IF;
    SELECT h.token INTO mark FROM %1$I.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    IF mark OPERATOR(pg_catalog.>) p_token THEN
        RAISE EXCEPTION 'stale fencing token %% for resource %%: the mark is %%', p_token, p_resource, mark
            USING ERRCODE = 'PF001';
    END IF;
    IF mark OPERATOR(pg_catalog.=) p_token
        AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885432937, pg_catalog.hashtext(p_resource));
        SELECT h.token INTO mark FROM %1$I.fence_high_water h
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
        IF mark OPERATOR(pg_catalog.=) p_token THEN
            RETURN p_token;
        END IF;
        IF mark OPERATOR(pg_catalog.>) p_token THEN
            RAISE EXCEPTION 'stale fencing token %% for resource %%: the mark is %%', p_token, p_resource, mark
                USING ERRCODE = 'PF001';
        END IF;
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(1885432937, pg_catalog.hashtext(p_resource));
    IF mark IS NOT NULL THEN
        UPDATE %1$I.fence_high_water h SET token = p_token, updated_at = pg_catalog.now()
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource
              AND h.token OPERATOR(pg_catalog.<=) p_token;
        IF FOUND THEN
            RETURN p_token;
        END IF;
    END IF;
    INSERT INTO %1$I.fence_high_water AS h (resource, token, updated_at)
        VALUES (p_resource, p_token, pg_catalog.now())
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = pg_catalog.now()
        WHERE h.token OPERATOR(pg_catalog.<=) EXCLUDED.token;
    IF FOUND THEN
        RETURN p_token;
    END IF;
    SELECT h.token INTO mark FROM %1$I.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    RAISE EXCEPTION 'stale fencing token %% for resource %%: the mark is %%', p_token, p_resource, mark
        USING ERRCODE = 'PF001';
END
$body$
$create$, current_schema());
END
$migration$;
