-- Palisade audit schema, version 2: where the lock-event tailer is in etcd history.

-- One row per etcd cluster: every revision up to `revision` has been read and its lock
-- events stored. Updated in the same transaction as the rows, so a crash anywhere
-- neither loses nor repeats a revision, and revisions without lock events still count.
CREATE TABLE audit_cursor (
    cluster_id bigint      PRIMARY KEY,
    revision   bigint      NOT NULL CHECK (revision >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
