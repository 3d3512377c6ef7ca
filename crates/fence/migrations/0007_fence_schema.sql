-- palisade-fence: the fence in a schema of its own, `palisade_fence`, with a privilege
-- model. This file alone brings a database from any earlier version of the fence (or none)
-- to the current one; it is idempotent, so running it again changes nothing.
--
-- Who may do what:
--   - the owner: the role that runs this file (docs/sql-api.md names it
--     `palisade_fence_owner`). It owns the schema, both tables and every function, and it is
--     the only role that may run this file again;
--   - writers: USAGE on the schema and EXECUTE on the raise functions (fence_raise,
--     fence_raise_or_abort, fence_raise_many, fence_decide, fence_decide_many), nothing on
--     the tables. The functions are SECURITY DEFINER: they write the marks as the owner,
--     and a mark only ever rises through them;
--   - resetters: EXECUTE on fence_reset, the only way to lower a mark, which logs every
--     reset (with session_user, the role that logged in) in the reset's own transaction.
-- PUBLIC gets nothing. Every function pins `SET search_path = pg_catalog, pg_temp` and
-- names its table and functions by schema, so nothing another role creates is ever looked
-- up by them. Callers name the functions by schema too (`palisade_fence.fence_raise(...)`):
-- a qualified call only considers the functions of that schema, so another role's overload
-- (say `fence_raise_or_abort(text, integer)` in a schema the caller searches first) is
-- never reached, and an integer argument of any width (smallint, integer, bigint) is cast
-- to this schema's bigint form.
--
-- Refused, naming the object, with SQLSTATE PF002 (nothing is changed):
--   - a schema `palisade_fence` that another role owns (created before this file ran);
--   - in that schema, any relation, function, type or operator another role owns, and any
--     function this file does not define (an overload of one of its names included);
--   - in the schema the earlier versions used (the current schema, usually `public`), a
--     table or function of the fence's names that another role owns.
--
-- From an earlier version (objects in the current schema): the tables are moved into
-- `palisade_fence` with their rows, the functions are dropped and created again there, and
-- the roles that could write the mark table (INSERT or UPDATE) get USAGE and EXECUTE on the
-- raise functions instead. Each step is reported as a NOTICE. Every run also revokes any
-- privilege beyond SELECT that a role other than the owner holds on either table.
DO $migration$
DECLARE
    me oid := (SELECT ro.oid FROM pg_catalog.pg_roles ro WHERE ro.rolname OPERATOR(pg_catalog.=) current_user);
    ns oid;
    old_ns oid;
    old_home text := pg_catalog.current_schema();
    -- The functions as `name(argument types)`, as pg_catalog.oidvectortypes writes them.
    expected text[] := ARRAY[
        'fence_raise(text, bigint)',
        'fence_raise_or_abort(text, bigint)',
        'fence_raise_many(text[], bigint[])',
        'fence_decide(text, bigint)',
        'fence_decide_many(text[], bigint[])',
        'fence_reset(text, bigint, text, text, bigint)'
    ];
    raisers text[] := ARRAY[
        'fence_raise(text, bigint)',
        'fence_raise_or_abort(text, bigint)',
        'fence_raise_many(text[], bigint[])',
        'fence_decide(text, bigint)',
        'fence_decide_many(text[], bigint[])'
    ];
    -- Signatures of earlier versions of this file, replaced below (their EXECUTE grants
    -- carried over to the current signature).
    retired text[] := ARRAY['fence_reset(text, bigint, text)'];
    names text[] := ARRAY['fence_raise', 'fence_raise_or_abort', 'fence_raise_many',
                          'fence_decide', 'fence_decide_many', 'fence_reset'];
    writers oid[] := '{}';
    r record;
    f text;
    n bigint;
BEGIN
-- Replicas that migrate at once take turns (the key of palisade_fence::migrate).
PERFORM pg_catalog.pg_advisory_xact_lock(1885432937);

-- The schema: ours, or refused.
SELECT s.oid INTO ns FROM pg_catalog.pg_namespace s WHERE s.nspname OPERATOR(pg_catalog.=) 'palisade_fence';
IF ns IS NOT NULL THEN
    SELECT pg_catalog.pg_get_userbyid(s.nspowner) INTO f FROM pg_catalog.pg_namespace s
        WHERE s.oid OPERATOR(pg_catalog.=) ns AND s.nspowner OPERATOR(pg_catalog.<>) me;
    IF FOUND THEN
        RAISE EXCEPTION 'schema palisade_fence is owned by role %, not by %, the role running the fence migrations', f, current_user
            USING ERRCODE = 'PF002',
                  HINT = 'run the migrations as the schema''s owner; a schema created by another role is not the fence''s: drop it';
    END IF;
    -- Everything in it is ours, and every function is one of ours.
    FOR r IN
        SELECT pg_catalog.format('%s palisade_fence.%I', CASE c.relkind WHEN 'r' THEN 'table' WHEN 'i' THEN 'index'
                   WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' ELSE 'relation' END, c.relname) AS what,
               c.relowner AS owner
            FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL
        SELECT pg_catalog.format('function palisade_fence.%I(%s)', p.proname, pg_catalog.oidvectortypes(p.proargtypes)),
               p.proowner
            FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) ns
        UNION ALL
        SELECT pg_catalog.format('type palisade_fence.%I', t.typname), t.typowner
            FROM pg_catalog.pg_type t WHERE t.typnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL
        SELECT pg_catalog.format('operator palisade_fence.%s', o.oprname), o.oprowner
            FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) ns
    LOOP
        IF r.owner OPERATOR(pg_catalog.<>) me THEN
            RAISE EXCEPTION '% is owned by role %, not by %, the owner of schema palisade_fence: it was not created by the fence migrations',
                r.what, pg_catalog.pg_get_userbyid(r.owner), current_user
                USING ERRCODE = 'PF002', HINT = 'drop it, then run the migrations again';
        END IF;
    END LOOP;
    FOR r IN
        SELECT pg_catalog.format('palisade_fence.%I(%s)', p.proname, pg_catalog.oidvectortypes(p.proargtypes)) AS fn
            FROM pg_catalog.pg_proc p
            WHERE p.pronamespace OPERATOR(pg_catalog.=) ns
              AND NOT (pg_catalog.format('%s(%s)', p.proname, pg_catalog.oidvectortypes(p.proargtypes))
                       OPERATOR(pg_catalog.=) ANY (expected OPERATOR(pg_catalog.||) retired))
    LOOP
        RAISE EXCEPTION 'function % was not created by the fence migrations', r.fn
            USING ERRCODE = 'PF002', HINT = 'drop it, then run the migrations again';
    END LOOP;
END IF;

-- The earlier versions' objects, in the schema they were created in: ours, or refused.
IF old_home IS NOT NULL AND old_home OPERATOR(pg_catalog.<>) 'palisade_fence' THEN
    SELECT s.oid INTO old_ns FROM pg_catalog.pg_namespace s WHERE s.nspname OPERATOR(pg_catalog.=) old_home;
    FOR r IN
        SELECT pg_catalog.format('table %I.%I', old_home, c.relname) AS what, c.relowner AS owner
            FROM pg_catalog.pg_class c
            WHERE c.relnamespace OPERATOR(pg_catalog.=) old_ns
              AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['fence_high_water', 'fence_reset_log']::name[])
        UNION ALL
        SELECT pg_catalog.format('function %I.%I(%s)', old_home, p.proname, pg_catalog.oidvectortypes(p.proargtypes)),
               p.proowner
            FROM pg_catalog.pg_proc p
            WHERE p.pronamespace OPERATOR(pg_catalog.=) old_ns AND p.proname OPERATOR(pg_catalog.=) ANY (names::name[])
    LOOP
        IF r.owner OPERATOR(pg_catalog.<>) me THEN
            RAISE EXCEPTION '% is owned by role %, not by %, the role running the fence migrations', r.what, pg_catalog.pg_get_userbyid(r.owner), current_user
                USING ERRCODE = 'PF002',
                      HINT = 'run the migrations as the role that ran the earlier ones; an object of a fence name that the fence did not create must be dropped (a caller of the unqualified name would reach it)';
        END IF;
    END LOOP;
END IF;

IF ns IS NULL THEN
    CREATE SCHEMA palisade_fence;
    RAISE NOTICE 'palisade_fence: created schema palisade_fence, owned by %', current_user;
END IF;
REVOKE ALL ON SCHEMA palisade_fence FROM PUBLIC;

IF old_ns IS NOT NULL THEN
    -- The roles that could write marks become writers of the new schema.
    SELECT COALESCE(pg_catalog.array_agg(DISTINCT a.grantee), '{}') INTO writers
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.relnamespace OPERATOR(pg_catalog.=) old_ns AND c.relname OPERATOR(pg_catalog.=) 'fence_high_water'
          AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['INSERT', 'UPDATE'])
          AND a.grantee OPERATOR(pg_catalog.<>) me;
    FOREACH f IN ARRAY ARRAY['fence_high_water', 'fence_reset_log'] LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                   WHERE c.relnamespace OPERATOR(pg_catalog.=) old_ns AND c.relname OPERATOR(pg_catalog.=) f) THEN
            IF pg_catalog.to_regclass('palisade_fence.' OPERATOR(pg_catalog.||) f) IS NOT NULL THEN
                RAISE EXCEPTION 'both %.% and palisade_fence.% exist', old_home, f, f
                    USING ERRCODE = 'PF002',
                          HINT = 'the first is an earlier version''s: merge its rows into the second by hand (a mark takes the greater token), drop it, then run the migrations again';
            END IF;
            EXECUTE pg_catalog.format('SELECT count(*) FROM %I.%I', old_home, f) INTO n;
            EXECUTE pg_catalog.format('ALTER TABLE %I.%I SET SCHEMA palisade_fence', old_home, f);
            RAISE NOTICE 'palisade_fence: moved table %.% (% rows) into schema palisade_fence', old_home, f, n;
        END IF;
    END LOOP;
    FOR r IN
        SELECT p.oid AS fn, p.proname AS name,
               pg_catalog.format('%I.%I(%s)', old_home, p.proname, pg_catalog.oidvectortypes(p.proargtypes)) AS what
            FROM pg_catalog.pg_proc p
            WHERE p.pronamespace OPERATOR(pg_catalog.=) old_ns AND p.proname OPERATOR(pg_catalog.=) ANY (names::name[])
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', r.fn::pg_catalog.regprocedure);
        RAISE NOTICE 'palisade_fence: dropped function % (call palisade_fence.% instead)', r.what, r.name;
    END LOOP;
END IF;

CREATE TABLE IF NOT EXISTS palisade_fence.fence_high_water (
    resource   text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS palisade_fence.fence_reset_log (
    id        bigserial   PRIMARY KEY,
    resource  text        NOT NULL,
    old_token bigint      NOT NULL,
    new_token bigint      NOT NULL,
    reason    text        NOT NULL,
    reset_by  text        NOT NULL,
    reset_at  timestamptz NOT NULL DEFAULT now()
);
-- The lock that guards the resource, as the resetter named it, and the token of its newest
-- grant then (the lowest the reset could set); both NULL for a reset with the lock unknown.
ALTER TABLE palisade_fence.fence_reset_log ADD COLUMN IF NOT EXISTS lock_key text;
ALTER TABLE palisade_fence.fence_reset_log ADD COLUMN IF NOT EXISTS lock_floor bigint;
-- Written by fence_reset only, which names the role itself (session_user: a default of
-- current_user would name the owner, whose rights the function runs with).
ALTER TABLE palisade_fence.fence_reset_log ALTER COLUMN reset_by DROP DEFAULT;

-- Only the owner writes the tables; anyone else keeps at most SELECT.
REVOKE ALL ON TABLE palisade_fence.fence_high_water, palisade_fence.fence_reset_log FROM PUBLIC;
REVOKE ALL ON SEQUENCE palisade_fence.fence_reset_log_id_seq FROM PUBLIC;
FOR r IN
    SELECT DISTINCT c.relname, c.relkind, a.grantee
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.relnamespace OPERATOR(pg_catalog.=) (SELECT s.oid FROM pg_catalog.pg_namespace s WHERE s.nspname OPERATOR(pg_catalog.=) 'palisade_fence')
          AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'S']::"char"[])
          AND a.grantee OPERATOR(pg_catalog.<>) me
          AND a.grantee OPERATOR(pg_catalog.<>) 0
          AND a.privilege_type OPERATOR(pg_catalog.<>) 'SELECT'
LOOP
    IF r.relkind OPERATOR(pg_catalog.=) 'S' THEN
        EXECUTE pg_catalog.format('REVOKE USAGE, UPDATE ON SEQUENCE palisade_fence.%I FROM %I CASCADE',
            r.relname, pg_catalog.pg_get_userbyid(r.grantee));
    ELSE
        EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON TABLE palisade_fence.%I FROM %I CASCADE',
            r.relname, pg_catalog.pg_get_userbyid(r.grantee));
    END IF;
    RAISE NOTICE 'palisade_fence: revoked every privilege but SELECT on palisade_fence.% from role % (marks are written through the functions only)',
        r.relname, pg_catalog.pg_get_userbyid(r.grantee);
END LOOP;

-- fence_raise(resource, token) returns the resource's mark as this transaction leaves it:
-- `token` when admitted, the higher mark when refused. Its rule is in docs/sql-api.md and
-- the docs of palisade_fence::postgres. An unlocked read picks the lock mode (a shared
-- lock upgraded to exclusive would deadlock two raisers of one resource); a token equal to
-- the mark takes the resource's advisory lock shared and reads again; a newer one takes it
-- exclusive and writes the row only if its token is still not above this one.
CREATE OR REPLACE FUNCTION palisade_fence.fence_raise(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    mark bigint;
BEGIN
    SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    IF mark OPERATOR(pg_catalog.>) p_token THEN
        RETURN mark;
    END IF;
    IF mark OPERATOR(pg_catalog.=) p_token
        AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885432937, pg_catalog.hashtext(p_resource));
        -- A new snapshot: sees any raise that committed before the lock was granted.
        SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
        IF mark OPERATOR(pg_catalog.>=) p_token THEN
            RETURN mark;
        END IF;
        -- Lowered by a reset meanwhile: raise it below.
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(1885432937, pg_catalog.hashtext(p_resource));
    IF mark IS NOT NULL THEN
        UPDATE palisade_fence.fence_high_water h SET token = p_token, updated_at = pg_catalog.now()
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource
              AND h.token OPERATOR(pg_catalog.<=) p_token;
        IF FOUND THEN
            RETURN p_token;
        END IF;
    END IF;
    INSERT INTO palisade_fence.fence_high_water AS h (resource, token, updated_at)
        VALUES (p_resource, p_token, pg_catalog.now())
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = pg_catalog.now()
        WHERE h.token OPERATOR(pg_catalog.<=) EXCLUDED.token;
    IF FOUND THEN
        RETURN p_token;
    END IF;
    -- Refused by a higher mark committed since the first read; the upsert locked the row.
    SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    RETURN mark;
END
$body$;

-- fence_raise_or_abort(resource, token): fence_raise's steps, but a refused token raises
-- SQLSTATE PF001 (aborting the transaction, so the statements after it do nothing), and a
-- NULL argument raises 22004. Returns the token when admitted.
CREATE OR REPLACE FUNCTION palisade_fence.fence_raise_or_abort(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    mark bigint;
BEGIN
    IF p_resource IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION 'fence_raise_or_abort: the resource and the token must not be NULL'
            USING ERRCODE = '22004';
    END IF;
    SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    IF mark OPERATOR(pg_catalog.>) p_token THEN
        RAISE EXCEPTION 'stale fencing token % for resource %: the mark is %', p_token, p_resource, mark
            USING ERRCODE = 'PF001';
    END IF;
    IF mark OPERATOR(pg_catalog.=) p_token
        AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885432937, pg_catalog.hashtext(p_resource));
        SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
        IF mark OPERATOR(pg_catalog.=) p_token THEN
            RETURN p_token;
        END IF;
        IF mark OPERATOR(pg_catalog.>) p_token THEN
            RAISE EXCEPTION 'stale fencing token % for resource %: the mark is %', p_token, p_resource, mark
                USING ERRCODE = 'PF001';
        END IF;
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(1885432937, pg_catalog.hashtext(p_resource));
    IF mark IS NOT NULL THEN
        UPDATE palisade_fence.fence_high_water h SET token = p_token, updated_at = pg_catalog.now()
            WHERE h.resource OPERATOR(pg_catalog.=) p_resource
              AND h.token OPERATOR(pg_catalog.<=) p_token;
        IF FOUND THEN
            RETURN p_token;
        END IF;
    END IF;
    INSERT INTO palisade_fence.fence_high_water AS h (resource, token, updated_at)
        VALUES (p_resource, p_token, pg_catalog.now())
        ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = pg_catalog.now()
        WHERE h.token OPERATOR(pg_catalog.<=) EXCLUDED.token;
    IF FOUND THEN
        RETURN p_token;
    END IF;
    SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    RAISE EXCEPTION 'stale fencing token % for resource %: the mark is %', p_token, p_resource, mark
        USING ERRCODE = 'PF001';
END
$body$;

-- fence_raise_many(resources, tokens): element i is what fence_raise(resources[i],
-- tokens[i]) returns, all in the caller's transaction, in the order of the resources'
-- lock keys (hashtext, then the name), so two calls that share resources cannot deadlock.
-- Arrays of different lengths, or with NULLs, raise 22004.
CREATE OR REPLACE FUNCTION palisade_fence.fence_raise_many(p_resources text[], p_tokens bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    marks bigint[] := '{}';
    r record;
BEGIN
    IF p_resources IS NULL OR p_tokens IS NULL
        OR pg_catalog.cardinality(p_resources) OPERATOR(pg_catalog.<>) pg_catalog.cardinality(p_tokens)
        OR pg_catalog.array_position(p_resources, NULL) IS NOT NULL
        OR pg_catalog.array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'fence_raise_many: two arrays of one length, without NULLs'
            USING ERRCODE = '22004';
    END IF;
    IF pg_catalog.cardinality(p_resources) OPERATOR(pg_catalog.>) 0 THEN
        marks := pg_catalog.array_fill(NULL::bigint, ARRAY[pg_catalog.cardinality(p_resources)]);
    END IF;
    FOR r IN
        SELECT u.i, u.res, u.tok
        FROM ROWS FROM (pg_catalog.unnest(p_resources), pg_catalog.unnest(p_tokens))
            WITH ORDINALITY AS u(res, tok, i)
        ORDER BY pg_catalog.hashtext(u.res), u.res, u.tok
    LOOP
        marks[r.i] := palisade_fence.fence_raise(r.res, r.tok);
    END LOOP;
    RETURN marks;
END
$body$;

-- fence_decide(resource, token): the raise of an autocommit statement. The committed mark
-- when it is at least the token (decided by that read alone: no lock, no write), else what
-- fence_raise returns. Not for a transaction that then writes (see docs/sql-api.md).
CREATE OR REPLACE FUNCTION palisade_fence.fence_decide(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    mark bigint;
BEGIN
    SELECT h.token INTO mark FROM palisade_fence.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    IF mark OPERATOR(pg_catalog.>=) p_token THEN
        RETURN mark;
    END IF;
    RETURN palisade_fence.fence_raise(p_resource, p_token);
END
$body$;

-- fence_decide_many(resources, tokens): element i is what fence_decide(resources[i],
-- tokens[i]) returns; each mark read by its own index lookup (a subquery per element, kept
-- apart by OFFSET 0: a join's cached generic plan hashes the whole table when it is small),
-- the fence_raise calls made in the order of the lock keys (volatile functions in a select
-- list run after its ORDER BY). Arrays of different lengths, or with NULLs, raise 22004.
CREATE OR REPLACE FUNCTION palisade_fence.fence_decide_many(p_resources text[], p_tokens bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    marks bigint[];
BEGIN
    IF p_resources IS NULL OR p_tokens IS NULL
        OR pg_catalog.cardinality(p_resources) OPERATOR(pg_catalog.<>) pg_catalog.cardinality(p_tokens)
        OR pg_catalog.array_position(p_resources, NULL) IS NOT NULL
        OR pg_catalog.array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'fence_decide_many: two arrays of one length, without NULLs'
            USING ERRCODE = '22004';
    END IF;
    SELECT pg_catalog.array_agg(d.mark ORDER BY d.i) INTO marks FROM (
        SELECT u.i,
               CASE WHEN u.mark OPERATOR(pg_catalog.>=) u.token THEN u.mark
                    ELSE palisade_fence.fence_raise(u.resource, u.token) END AS mark
        FROM (SELECT r.i, r.resource, r.token,
                     (SELECT h.token FROM palisade_fence.fence_high_water h
                        WHERE h.resource OPERATOR(pg_catalog.=) r.resource) AS mark
              FROM ROWS FROM (pg_catalog.unnest(p_resources), pg_catalog.unnest(p_tokens))
                  WITH ORDINALITY AS r(resource, token, i)
              OFFSET 0) u
        ORDER BY pg_catalog.hashtext(u.resource), u.resource) d;
    RETURN COALESCE(marks, '{}');
END
$body$;

-- fence_reset(resource, to_token, reason, lock_key, lock_floor) lowers the resource's mark
-- to to_token and returns the mark it replaced. It takes the resource's advisory lock
-- exclusive (so it waits for every fenced transaction in flight), refuses (22023) an empty
-- reason, a negative token, a to_token not below the mark, a lock_key without its
-- lock_floor (or the reverse), and a to_token below lock_floor (the newest grant of the
-- lock that guards the resource: a lower mark would admit that lock's earlier holders
-- again); refuses (P0002) a resource with no mark; raises 22004 for a NULL resource,
-- token or reason. It logs resource, old and new mark, reason, lock_key and lock_floor
-- (both NULL: the lock was unknown to the resetter), session_user (the role that logged
-- in; SET ROLE does not change it) and time in fence_reset_log, in its own transaction. It
-- never deletes the row: no mark would admit any token.
CREATE OR REPLACE FUNCTION palisade_fence.fence_reset(p_resource text, p_to bigint, p_reason text,
    p_lock_key text DEFAULT NULL, p_lock_floor bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    old bigint;
BEGIN
    IF p_resource IS NULL OR p_to IS NULL OR p_reason IS NULL THEN
        RAISE EXCEPTION 'fence_reset: the resource, the token and the reason must not be NULL'
            USING ERRCODE = '22004';
    END IF;
    IF pg_catalog.btrim(p_reason) OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'fence_reset of %: a reason is required', p_resource
            USING ERRCODE = '22023';
    END IF;
    IF p_to OPERATOR(pg_catalog.<) 0 THEN
        RAISE EXCEPTION 'fence_reset of %: token % is negative', p_resource, p_to
            USING ERRCODE = '22023';
    END IF;
    IF (p_lock_key IS NULL) OPERATOR(pg_catalog.<>) (p_lock_floor IS NULL) THEN
        RAISE EXCEPTION 'fence_reset of %: a lock key and the token of its newest grant go together', p_resource
            USING ERRCODE = '22023';
    END IF;
    IF p_to OPERATOR(pg_catalog.<) p_lock_floor THEN
        RAISE EXCEPTION 'fence_reset of %: % is below %, the newest grant of lock %; a lower mark would admit its earlier holders again', p_resource, p_to, p_lock_floor, p_lock_key
            USING ERRCODE = '22023';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(1885432937, pg_catalog.hashtext(p_resource));
    SELECT h.token INTO old FROM palisade_fence.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fence_reset: % has no mark', p_resource
            USING ERRCODE = 'P0002';
    END IF;
    IF p_to OPERATOR(pg_catalog.>=) old THEN
        RAISE EXCEPTION 'fence_reset of %: % is not below the mark %; a reset only lowers a mark', p_resource, p_to, old
            USING ERRCODE = '22023';
    END IF;
    UPDATE palisade_fence.fence_high_water h SET token = p_to, updated_at = pg_catalog.now()
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    INSERT INTO palisade_fence.fence_reset_log (resource, old_token, new_token, reason, reset_by, lock_key, lock_floor)
        VALUES (p_resource, old, p_to, p_reason, session_user, p_lock_key, p_lock_floor);
    RETURN old;
END
$body$;

FOREACH f IN ARRAY expected LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION palisade_fence.%s FROM PUBLIC', f);
END LOOP;

-- The 3-argument fence_reset of the previous version: a call to it would lower a mark
-- unchecked against any lock, so it is dropped; the roles that could run it may run the
-- current one (a 3-argument call reaches it, as a reset with the lock unknown).
IF pg_catalog.to_regprocedure('palisade_fence.fence_reset(text, bigint, text)') IS NOT NULL THEN
    FOR r IN
        SELECT DISTINCT a.grantee
            FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
            WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('palisade_fence.fence_reset(text, bigint, text)')
              AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
              AND a.grantee OPERATOR(pg_catalog.<>) me
              AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION palisade_fence.fence_reset(text, bigint, text, text, bigint) TO %I',
            pg_catalog.pg_get_userbyid(r.grantee));
        RAISE NOTICE 'palisade_fence: role % could run fence_reset(text, bigint, text): granted it EXECUTE on fence_reset(text, bigint, text, text, bigint)',
            pg_catalog.pg_get_userbyid(r.grantee);
    END LOOP;
    DROP FUNCTION palisade_fence.fence_reset(text, bigint, text);
    RAISE NOTICE 'palisade_fence: dropped function palisade_fence.fence_reset(text, bigint, text) (replaced by fence_reset(text, bigint, text, text, bigint))';
END IF;

IF pg_catalog.cardinality(writers) OPERATOR(pg_catalog.>) 0 THEN
    FOR r IN SELECT pg_catalog.pg_get_userbyid(w) AS role FROM pg_catalog.unnest(writers) w LOOP
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA palisade_fence TO %I', r.role);
        FOREACH f IN ARRAY raisers LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION palisade_fence.%s TO %I', f, r.role);
        END LOOP;
        RAISE NOTICE 'palisade_fence: role % could write %.fence_high_water: granted it USAGE on schema palisade_fence and EXECUTE on the raise functions',
            r.role, old_home;
    END LOOP;
END IF;
END
$migration$;
