-- Palisade audit schema, version 1: lock events, forced releases, resource write events.

-- One row per lock event read from etcd history, or per compaction gap.
-- cluster_id holds the etcd cluster id (a u64) bit for bit as a signed BIGINT.
-- seq orders the events of one revision (one transaction can delete several keys, as a
-- lease expiry does), so (cluster_id, revision, seq) is stable across replays.
CREATE TABLE audit_event (
    cluster_id  bigint      NOT NULL,
    revision    bigint      NOT NULL CHECK (revision > 0),
    seq         integer     NOT NULL DEFAULT 0 CHECK (seq >= 0),
    type        text        NOT NULL CHECK (type IN ('grant', 'release', 'expire', 'force', 'gap')),
    lock_key    text,
    namespace   text,
    class       text,
    spiffe_id   text,
    token       bigint      CHECK (token >= 0),
    gap_from    bigint,
    gap_to      bigint,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_id, revision, seq),
    CHECK ((type = 'gap') = (gap_from IS NOT NULL AND gap_to IS NOT NULL)),
    CHECK (type <> 'gap' OR gap_from <= gap_to),
    CHECK (type = 'gap' OR lock_key IS NOT NULL)
);
CREATE INDEX audit_event_lock_key ON audit_event (lock_key, revision DESC);

-- One row per forced release; joins audit_event on (cluster_id, revision), outlives the key.
CREATE TABLE force_release (
    request_id       text        PRIMARY KEY,
    cluster_id       bigint      NOT NULL,
    revision         bigint      NOT NULL CHECK (revision > 0),
    lock_key         text        NOT NULL,
    requester        text        NOT NULL,
    approver         text        NOT NULL,
    reason           text        NOT NULL,
    class_was_fenced boolean     NOT NULL,
    at               timestamptz NOT NULL,
    CHECK (requester <> approver)
);
CREATE INDEX force_release_at ON force_release (at DESC);
CREATE INDEX force_release_lock_key ON force_release (lock_key, revision DESC);

-- One row per write a fence layer checked (or per batch of events dropped under overload).
-- id is minted by the sink (UUID v7), so replaying a spool duplicates nothing.
CREATE TABLE write_event (
    id          uuid        PRIMARY KEY,
    at          timestamptz NOT NULL,
    service     text        NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN ('admitted', 'rejected', 'unprotected', 'dropped')),
    resource    text,
    method      text,
    token       bigint      CHECK (token >= 0),
    highest     bigint      CHECK (highest >= 0),
    finding     text        CHECK (finding IN ('current', 'missing_token', 'malformed_token', 'stale', 'store_unavailable')),
    enforcement text        CHECK (enforcement IN ('fenced', 'advisory')),
    namespace   text,
    class       text,
    caller      text,
    dropped     bigint      CHECK (dropped > 0),
    CHECK ((outcome = 'dropped') = (dropped IS NOT NULL)),
    CHECK (outcome = 'dropped' OR (resource IS NOT NULL AND method IS NOT NULL AND finding IS NOT NULL))
);
-- The dashboard reads unprotected writes newest first, with optional equality filters:
-- partial indexes hold only those rows (admitted writes are the bulk of the table).
CREATE INDEX write_event_unprotected_at ON write_event (at DESC, id DESC) WHERE outcome = 'unprotected';
CREATE INDEX write_event_unprotected_resource ON write_event (resource, at DESC) WHERE outcome = 'unprotected';
CREATE INDEX write_event_unprotected_service ON write_event (service, at DESC) WHERE outcome = 'unprotected';
CREATE INDEX write_event_unprotected_caller ON write_event (caller, at DESC) WHERE outcome = 'unprotected';
CREATE INDEX write_event_unprotected_class ON write_event (namespace, class, at DESC) WHERE outcome = 'unprotected';
