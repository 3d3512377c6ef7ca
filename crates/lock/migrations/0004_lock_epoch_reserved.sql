-- palisade-lock: the epoch reservation (see the crate docs, # Epochs). A row written
-- before this column existed has NULL here, read as highest_grant_rev. Within an epoch
-- reserved_rev only rises, as highest_grant_rev does.
ALTER TABLE lock_epoch ADD COLUMN IF NOT EXISTS reserved_rev bigint CHECK (reserved_rev >= 0);
