-- Palisade audit schema, version 4: what each audited revision held, so that history a
-- restored etcd cluster repeats under a new cluster id is recognised and not audited twice.

-- One row per revision that changed the lock key space, as the tailer read it: digest is
-- SHA-256 over that revision's changes in etcd's order (kind, key, value, create and mod
-- revision, version, lease; see the tailer's docs). Written in the transaction that
-- stores the revision's events and moves the cursor past it.
CREATE TABLE audit_history (
    cluster_id bigint NOT NULL,
    revision   bigint NOT NULL CHECK (revision > 0),
    digest     bytea  NOT NULL CHECK (length(digest) = 32),
    PRIMARY KEY (cluster_id, revision)
);

-- The audited clusters whose history this cluster's history has repeated so far, revision
-- for revision. NULL until the tailer has compared a revision; empty once the history
-- differs from every one of them (from then on, everything it reads is new).
ALTER TABLE audit_cursor ADD COLUMN repeats bigint[];
