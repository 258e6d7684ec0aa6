"""The continuous snapshot of the live entries (and of the registry) in PostgreSQL: the
schema and its migrations, the snapshotter that follows the partition event streams, and
what `status` shows of it."""
