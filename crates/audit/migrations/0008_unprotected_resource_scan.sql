-- Palisade audit schema, version 8: the overview's top resources read from an index alone.

-- The overview counts the window's unprotected writes per resource (a resource has too
-- many values for the hourly counters). The index on (at, id) now carries the resource,
-- so that count is one index-only range scan of the window's entries, with no heap visit
-- and no walk over every resource's entries (write_event_unprotected_resource is ordered
-- by resource first).
DROP INDEX write_event_unprotected_at;
CREATE INDEX write_event_unprotected_at ON write_event (at DESC, id DESC) INCLUDE (resource)
    WHERE outcome = 'unprotected';
