-- Palisade audit schema, version 11: what a mark reset was checked against. `lock_key` is
-- the lock that guards the resource as the resetter named it, `lock_floor` the lowest mark
-- the reset could set (the lock's newest grant); both NULL for a reset made with the lock
-- unknown (`palisade fence reset --lock-unknown`, and every reset recorded before this
-- version). `actor` is now the database role that ran the reset (its session_user).
ALTER TABLE fence_reset
    ADD COLUMN lock_key   text,
    ADD COLUMN lock_floor bigint,
    ADD CONSTRAINT fence_reset_lock_floor CHECK (
        (lock_key IS NULL) = (lock_floor IS NULL)
        AND (lock_floor IS NULL OR (lock_floor >= 0 AND new_token >= lock_floor))
    );
