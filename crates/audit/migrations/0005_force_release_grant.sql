-- Palisade audit schema, version 5: which grant a forced release ended. NULL in rows
-- recorded before version 5 (the request then named only the lock key).
ALTER TABLE force_release ADD COLUMN grant_rev bigint CHECK (grant_rev > 0);
ALTER TABLE force_release ADD COLUMN token bigint CHECK (token >= 0);
