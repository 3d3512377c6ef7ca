-- Palisade audit schema, version 8: the overview's counts read from indexes alone.

-- The overview counts the window's unprotected writes per resource (a resource has too
-- many values for the hourly counters) and its refused writes per finding. The indexes
-- on (at, id) of those rows now carry the column counted, so each count is one
-- index-only range scan of the window's entries: no heap visit, and no walk over every
-- resource's entries (write_event_unprotected_resource is ordered by resource first).
DROP INDEX write_event_unprotected_at;
CREATE INDEX write_event_unprotected_at ON write_event (at DESC, id DESC) INCLUDE (resource)
    WHERE outcome = 'unprotected';
DROP INDEX write_event_rejected_at;
CREATE INDEX write_event_rejected_at ON write_event (at DESC, id DESC) INCLUDE (finding)
    WHERE outcome = 'rejected';

-- The overview's counts (24 hours, 7 days, the 7 days before) sum the hourly counters of
-- their hours: an index on the hour carrying the count sums them without a heap visit.
CREATE INDEX write_event_hourly_hour ON write_event_hourly (hour) INCLUDE (n);
