-- palisade-fence: reading a mark, and lowering one that a mistaken token poisoned.
-- Idempotent; the same ownership rule as 0002.
--
-- fence_reset_log: one row per reset, written in the reset's own transaction, so a
-- reset cannot happen without leaving its row (whoever ran it, from any client).
--
-- fence_reset(resource, to_token, reason) lowers the resource's mark to to_token and
-- returns the mark it replaced. It
--   - takes the resource's advisory lock exclusive (as a raise does), so it waits for
--     every fenced transaction in flight on the resource, and later writers see the
--     lowered mark;
--   - refuses (SQLSTATE 22023) an empty reason, a negative token, or a to_token not below
--     the mark (a reset only lowers; raising is fence_raise's job);
--   - refuses (SQLSTATE P0002) a resource with no mark;
--   - raises 22004 for a NULL argument;
--   - logs resource, old mark, new mark, reason, current_user and time in fence_reset_log.
-- It never deletes the row: a deleted mark would admit any token, the oldest included.
-- Set to_token to the token of the lock's current (or last) hold: every older holder
-- stays refused, since tokens only grow with each grant.
CREATE TABLE IF NOT EXISTS fence_reset_log (
    id        bigserial   PRIMARY KEY,
    resource  text        NOT NULL,
    old_token bigint      NOT NULL,
    new_token bigint      NOT NULL,
    reason    text        NOT NULL,
    reset_by  text        NOT NULL DEFAULT current_user,
    reset_at  timestamptz NOT NULL DEFAULT now()
);

DO $migration$
BEGIN
IF EXISTS (
    SELECT 1 FROM pg_proc p
    WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
      AND p.proname = 'fence_reset'
      AND NOT pg_has_role(current_user, p.proowner, 'USAGE')
) THEN
    RETURN;
END IF;
PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);

CREATE OR REPLACE FUNCTION fence_reset(p_resource text, p_to bigint, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    old bigint;
BEGIN
    IF p_resource IS NULL OR p_to IS NULL OR p_reason IS NULL THEN
        RAISE EXCEPTION 'fence_reset: the resource, the token and the reason must not be NULL'
            USING ERRCODE = '22004';
    END IF;
    IF btrim(p_reason) = '' THEN
        RAISE EXCEPTION 'fence_reset of %: a reason is required', p_resource
            USING ERRCODE = '22023';
    END IF;
    IF p_to < 0 THEN
        RAISE EXCEPTION 'fence_reset of %: token % is negative', p_resource, p_to
            USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(1885432937, hashtext(p_resource));
    SELECT token INTO old FROM fence_high_water WHERE resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fence_reset: % has no mark', p_resource
            USING ERRCODE = 'P0002';
    END IF;
    IF p_to >= old THEN
        RAISE EXCEPTION 'fence_reset of %: % is not below the mark %; a reset only lowers a mark', p_resource, p_to, old
            USING ERRCODE = '22023';
    END IF;
    UPDATE fence_high_water SET token = p_to, updated_at = now() WHERE resource = p_resource;
    INSERT INTO fence_reset_log (resource, old_token, new_token, reason)
        VALUES (p_resource, old, p_to, p_reason);
    RETURN old;
END
$$;
END
$migration$;
