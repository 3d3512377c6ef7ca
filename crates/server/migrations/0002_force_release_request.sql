-- Two-person force release: one row per request; idempotent.
-- A request is made by one admin and approved (at most once) by a different admin.
CREATE TABLE IF NOT EXISTS force_release_request (
    id           text        PRIMARY KEY,
    namespace    text        NOT NULL,
    class        text        NOT NULL,
    key          text        NOT NULL,
    requester    text        NOT NULL,
    reason       text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    approver     text,
    approved_at  timestamptz,
    CHECK (approver IS NULL OR approver <> requester),
    CHECK ((approver IS NULL) = (approved_at IS NULL))
);
CREATE INDEX IF NOT EXISTS force_release_request_pending
    ON force_release_request (requested_at DESC) WHERE approver IS NULL;
