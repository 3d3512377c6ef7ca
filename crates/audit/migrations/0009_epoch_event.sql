-- Palisade audit schema, version 9: epoch advances and rehome switches read from etcd
-- history.

-- One row per epoch record (`config/epoch`) written in a tailed cluster: the epoch, why
-- it started (bootstrap, restore, rehome), and the etcd cluster its record names.
-- cluster_id and revision are where the tailer read the record; epoch_cluster_id is the
-- record's own cluster id. A cluster restored from a snapshot serves its source's
-- records again under a new cluster id: the unique index on the record's identity
-- (epoch_cluster_id, epoch) stores each record once. They are kept apart from
-- audit_event, whose rows are lock events (each with a lock key) that checkers match
-- against holds.
CREATE TABLE epoch_event (
    cluster_id       bigint      NOT NULL,
    revision         bigint      NOT NULL CHECK (revision > 0),
    epoch            integer     NOT NULL CHECK (epoch >= 0 AND epoch < 32768),
    reason           text        NOT NULL CHECK (reason IN ('bootstrap', 'restore', 'rehome')),
    epoch_cluster_id bigint      NOT NULL,
    advanced_at      timestamptz NOT NULL,
    start_revision   bigint      NOT NULL CHECK (start_revision >= 0),
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_id, revision)
);
CREATE UNIQUE INDEX epoch_event_record ON epoch_event (epoch_cluster_id, epoch);
CREATE INDEX epoch_event_recorded_at ON epoch_event (recorded_at DESC);

-- One row per rehome switch (the commit point of moving a namespace between tiers): the
-- home tier's `tier/rehome/<ns>` record rewritten to phase `switched`, which names the
-- namespace, the tiers and the epoch the new tier serves it under. Joins epoch_event on
-- epoch (epochs are one sequence across tiers). (namespace, epoch) identifies a move, so
-- history a restored home cluster serves again is stored once.
CREATE TABLE rehome_event (
    cluster_id  bigint      NOT NULL,
    revision    bigint      NOT NULL CHECK (revision > 0),
    namespace   text        NOT NULL,
    from_tier   text        NOT NULL,
    to_tier     text        NOT NULL,
    epoch       integer     NOT NULL CHECK (epoch >= 0 AND epoch < 32768),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_id, revision)
);
CREATE UNIQUE INDEX rehome_event_move ON rehome_event (namespace, epoch);
CREATE INDEX rehome_event_epoch ON rehome_event (epoch);
