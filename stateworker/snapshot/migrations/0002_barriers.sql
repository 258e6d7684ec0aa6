-- Barrier state (state::barrier): one row per barrier, its Redis hash as it was last read.
-- `fields` is the hash as jsonb (field -> text), for queries; NULL when a field's name or text
-- holds a NUL character, which jsonb refuses. `exact` is the hash as msgpack (a map of bytes to
-- bytes), what restore writes back. `w` is the hash's write count: a row is only replaced by a
-- newer one, so a state read twice, or read late, never overwrites a newer one.
CREATE TABLE sw_barriers (
    prefix     text    NOT NULL,
    id         text    NOT NULL,
    partition  integer NOT NULL,
    fields     jsonb,
    exact      bytea   NOT NULL,
    w          bigint  NOT NULL,
    PRIMARY KEY (prefix, id)
);
