-- Palisade audit schema, version 6: resets of a resource's high-water mark
-- (`palisade fence reset`). The resource's own database logs each one too
-- (fence_reset_log); this is the copy in the audit trail, beside forced releases.
CREATE TABLE fence_reset (
    id        uuid        PRIMARY KEY,
    at        timestamptz NOT NULL,
    resource  text        NOT NULL,
    old_token bigint      NOT NULL CHECK (old_token >= 0),
    new_token bigint      NOT NULL CHECK (new_token >= 0 AND new_token < old_token),
    reason    text        NOT NULL CHECK (btrim(reason) <> ''),
    actor     text        NOT NULL
);
CREATE INDEX fence_reset_resource ON fence_reset (resource, at);
