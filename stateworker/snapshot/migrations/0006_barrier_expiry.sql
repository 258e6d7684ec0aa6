-- A completed barrier expires (STATEWORKER_BARRIER_TTL_S): `expires_ms` is its hash's field
-- `z` (epoch ms; NULL while it is not complete). The snapshotter deletes the rows past it, and
-- a restore leaves them out and gives the others their expiry back.
ALTER TABLE sw_barriers ADD COLUMN expires_ms bigint;
CREATE INDEX sw_barriers_expiry ON sw_barriers (prefix, expires_ms) WHERE expires_ms IS NOT NULL;
