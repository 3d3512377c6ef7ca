-- palisade-fence: the high-water mark of every fenced resource.
-- A row's token only ever rises; the row lock taken by the raise serializes the writers
-- of one resource until their transaction ends.
CREATE TABLE IF NOT EXISTS fence_high_water (
    resource   text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
