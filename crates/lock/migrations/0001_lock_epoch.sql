-- palisade-lock: the durable epoch record shared by every locker of one key space.
-- One row per root prefix. Writes are a max-merge (see PostgresEpochStore): the epoch
-- only rises, and within an epoch highest_grant_rev only rises.
CREATE TABLE IF NOT EXISTS lock_epoch (
    root              text        PRIMARY KEY,
    epoch             integer     NOT NULL CHECK (epoch >= 0 AND epoch < 32768),
    cluster_id        bigint      NOT NULL,
    advanced_at_ms    bigint      NOT NULL CHECK (advanced_at_ms >= 0),
    reason            text        NOT NULL CHECK (reason IN ('bootstrap', 'restore', 'rehome')),
    highest_grant_rev bigint      NOT NULL CHECK (highest_grant_rev >= 0),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
