-- palisade-fence: the set-based raise, for a store that decides many raises in one round
-- trip. Idempotent (CREATE OR REPLACE); the same ownership rule as 0002.
--
-- fence_raise_many(resources text[], tokens bigint[]) returns bigint[]: element i is what
-- fence_raise(resources[i], tokens[i]) returns (the token when admitted, the higher mark
-- when refused), all in the caller's transaction. The raises run in the order of the
-- resources' advisory-lock keys (hashtext, then the name), so two calls that share
-- resources take their locks in one order and cannot deadlock with each other. Pass each
-- resource once: the same resource twice with an equal and then a newer token asks for
-- its lock shared and then exclusive, which deadlocks with another transaction doing the
-- same (Postgres reports 40P01). Arrays of different lengths, or with NULLs, raise 22004.
DO $migration$
BEGIN
IF EXISTS (
    SELECT 1 FROM pg_proc p
    WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
      AND p.proname = 'fence_raise_many'
      AND NOT pg_has_role(current_user, p.proowner, 'USAGE')
) THEN
    RETURN;
END IF;
PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);

CREATE OR REPLACE FUNCTION fence_raise_many(p_resources text[], p_tokens bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    marks bigint[] := '{}';
    r record;
BEGIN
    IF p_resources IS NULL OR p_tokens IS NULL
        OR cardinality(p_resources) <> cardinality(p_tokens)
        OR array_position(p_resources, NULL) IS NOT NULL
        OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'fence_raise_many: two arrays of one length, without NULLs'
            USING ERRCODE = '22004';
    END IF;
    IF cardinality(p_resources) > 0 THEN
        marks := array_fill(NULL::bigint, ARRAY[cardinality(p_resources)]);
    END IF;
    FOR r IN
        SELECT u.i, u.res, u.tok
        FROM unnest(p_resources, p_tokens) WITH ORDINALITY AS u(res, tok, i)
        ORDER BY hashtext(u.res), u.res, u.tok
    LOOP
        marks[r.i] := fence_raise(r.res, r.tok);
    END LOOP;
    RETURN marks;
END
$$;
END
$migration$;
