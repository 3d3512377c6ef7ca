-- palisade-fence: the raise as a store decides it, outside any transaction of the caller's.
-- Idempotent (CREATE OR REPLACE); the same ownership rule as 0002. Names are qualified by
-- schema as in 0005 (no SET clause).
--
-- fence_decide(resource text, token bigint) returns bigint: the resource's committed mark
-- when it is at least the token (a token equal to it admitted, a lower one refused, by that
-- read alone: no lock, no write), else what fence_raise(resource, token) returns. For an
-- autocommit statement only: inside a transaction, an equal token admitted without the
-- shared lock does not order the transaction's later writes after a newer raise, so a
-- transaction that writes under a token calls fence_raise or fence_raise_or_abort.
--
-- fence_decide_many(resources text[], tokens bigint[]) returns bigint[]: element i is what
-- fence_decide(resources[i], tokens[i]) returns, each mark read by an index lookup and the
-- fence_raise calls made in the order of the resources' advisory-lock keys (hashtext, then
-- the name; volatile functions in a select list run after its ORDER BY), so two calls
-- that share resources cannot deadlock. Pass each resource once (a repeated resource's
-- elements are each decided against the mark committed before the call). Arrays of
-- different lengths, or with NULLs, raise 22004.
--
-- Both are what PostgresStore sends, one short statement per batch: PL/pgSQL keeps the
-- plans of the statements inside on the connection, so the server parses and plans the
-- statement once per connection instead of once per batch, and no prepared statement (session
-- state a transaction-mode pooler cannot keep) is needed.
DO $migration$
BEGIN
IF EXISTS (
    SELECT 1 FROM pg_proc p
    WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
      AND p.proname IN ('fence_decide', 'fence_decide_many')
      AND NOT pg_has_role(current_user, p.proowner, 'USAGE')
) THEN
    RETURN;
END IF;

EXECUTE format($create$
CREATE OR REPLACE FUNCTION %1$I.fence_decide(p_resource text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT AS $body$
DECLARE
    mark bigint;
BEGIN
    SELECT h.token INTO mark FROM %1$I.fence_high_water h
        WHERE h.resource OPERATOR(pg_catalog.=) p_resource;
    IF mark OPERATOR(pg_catalog.>=) p_token THEN
        RETURN mark;
    END IF;
    RETURN %1$I.fence_raise(p_resource, p_token);
END
$body$
$create$, current_schema());

EXECUTE format($create$
CREATE OR REPLACE FUNCTION %1$I.fence_decide_many(p_resources text[], p_tokens bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $body$
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
    -- Each mark by its own index lookup (a subquery per element, kept apart by OFFSET 0):
    -- a join's cached generic plan hashes the whole mark table when it is small.
    SELECT pg_catalog.array_agg(d.mark ORDER BY d.i) INTO marks FROM (
        SELECT u.i,
               CASE WHEN u.mark OPERATOR(pg_catalog.>=) u.token THEN u.mark
                    ELSE %1$I.fence_raise(u.resource, u.token) END AS mark
        FROM (SELECT r.i, r.resource, r.token,
                     (SELECT h.token FROM %1$I.fence_high_water h
                        WHERE h.resource OPERATOR(pg_catalog.=) r.resource) AS mark
              FROM ROWS FROM (pg_catalog.unnest(p_resources), pg_catalog.unnest(p_tokens))
                  WITH ORDINALITY AS r(resource, token, i)
              OFFSET 0) u
        ORDER BY pg_catalog.hashtext(u.resource), u.resource) d;
    RETURN COALESCE(marks, '{}');
END
$body$
$create$, current_schema());
END
$migration$;
