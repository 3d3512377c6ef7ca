-- Force release execution state; idempotent.
-- targets: the holds the approval found (JSON array), fixed before any is deleted, so a
-- retried execution deletes only those, each at most once.
-- executed_at: when every target was handled; NULL while approved but not executed.
ALTER TABLE force_release_request ADD COLUMN IF NOT EXISTS targets text;
ALTER TABLE force_release_request ADD COLUMN IF NOT EXISTS executed_at timestamptz;
