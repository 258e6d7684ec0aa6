"""The snapshot's schema: numbered SQL migrations (package data, `migrations/NNNN_name.sql`),
applied at start in order under a PostgreSQL advisory lock (replicas starting together apply
each one once), each recorded in `sw_schema_migrations` in the transaction that applies it.

A database that has a migration this code does not know was migrated by a newer version:
the service refuses to run against it (ConfigError naming both versions) rather than write
rows in a shape it does not know."""

from __future__ import annotations

import logging
import re
from importlib import resources

import psycopg

from stateworker.errors import ConfigError

log = logging.getLogger("stateworker.snapshot.schema")

# pg_advisory_xact_lock key of the migrations: any fixed number, the same in every version.
MIGRATION_LOCK = 0x5357_4D49  # "SWMI"
_NAME_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class Migration:
    def __init__(self, version: int, name: str, sql: str) -> None:
        self.version = version
        self.name = name
        self.sql = sql


def migrations() -> list[Migration]:
    """The migrations shipped with this version, in order."""
    found = []
    for entry in resources.files("stateworker.snapshot").joinpath("migrations").iterdir():
        matched = _NAME_RE.match(entry.name)
        if matched:
            found.append(Migration(int(matched[1]), matched[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    assert [m.version for m in found] == list(range(1, len(found) + 1)), "migration numbering"
    return found


def known_version() -> int:
    return len(migrations())


async def migrate(conn: psycopg.AsyncConnection[object]) -> int:
    """Bring the schema up to this version's; the schema version. ConfigError when the
    database is newer than this code."""
    known = migrations()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS sw_schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        cursor = await conn.execute("SELECT coalesce(max(version), 0) FROM sw_schema_migrations")
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0  # type: ignore[index]
        if current > len(known):
            raise ConfigError(
                f"the PostgreSQL schema is at version {current}, newer than this stateworker "
                f"knows ({len(known)}): a newer version migrated it; run that version")
        for migration in known[current:]:
            await conn.execute(migration.sql.encode())
            await conn.execute("INSERT INTO sw_schema_migrations (version, name) VALUES (%s, %s)",
                               (migration.version, migration.name))
            log.info("applied migration %04d_%s", migration.version, migration.name,
                     extra={"event": "snapshot.migrated", "version": migration.version})
    return max(current, len(known))
