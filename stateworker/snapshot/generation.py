"""The generation marker's side in PostgreSQL (`sw_generations`; state/generation.py has
Redis's side): which Redis dataset the snapshot follows, and the fence every commit passes.

Every transaction that writes what it read from Redis (a partition's batch, a rescan, the
registry, barriers, call records) first locks the prefix's generation row (FOR SHARE) and
checks it is the generation the snapshotter confirmed in Redis, before and after it read
there (`Fenced`). A restore replaces the row (FOR UPDATE: it waits for a commit in
progress), so a snapshotter still reading the Redis of before never commits afterwards.
"""

from __future__ import annotations

import psycopg
from psycopg import AsyncCursor

from stateworker.clock import now_ms
from stateworker.errors import StoreLost

PgConnection = psycopg.AsyncConnection[tuple[object, ...]]

ADOPT = """
INSERT INTO sw_generations (prefix, generation, cause, begun_ms, partitions)
VALUES (%s, %s, 'adopted', %s, %s)
ON CONFLICT (prefix) DO NOTHING
"""

REPLACE = """
INSERT INTO sw_generations AS g (prefix, generation, cause, begun_ms, registry_n, partitions)
VALUES (%s, %s, 'restore', %s, %s, %s)
ON CONFLICT (prefix) DO UPDATE SET generation = excluded.generation, cause = excluded.cause,
    begun_ms = excluded.begun_ms, registry_n = excluded.registry_n,
    partitions = excluded.partitions
"""

# A row from before the column: the count of the Redis dataset it follows, once a snapshotter
# of that generation confirmed it (its Redis's meta hash holds the count: lifecycle.check_server).
FILL_PARTITIONS = """
UPDATE sw_generations SET partitions = %s
WHERE prefix = %s AND generation = %s AND partitions IS NULL
"""


def restore_lock(prefix: str) -> str:
    """The name of the advisory lock one restore of `prefix` at a time holds
    (snapshot/restore.py `exclusive`; a snapshotter finishing a stopped one takes it too)."""
    return f"stateworker restore {prefix}"


async def try_restore_lock(pg: PgConnection, prefix: str) -> bool:
    """Take the restore's lock (session-level) if no one holds it."""
    row = await (await pg.execute("SELECT pg_try_advisory_lock(hashtext(%s))",
                                  (restore_lock(prefix),))).fetchone()
    return bool(row and row[0])


async def restore_unlock(pg: PgConnection, prefix: str) -> None:
    await pg.execute("SELECT pg_advisory_unlock(hashtext(%s))", (restore_lock(prefix),))


class Fenced(StoreLost):
    """Raised when a commit finds that PostgreSQL follows another generation than the Redis
    it read (a restore since, or a wiped Redis): nothing of it was committed."""


async def stored(pg: PgConnection, prefix: str) -> str | None:
    row = await (await pg.execute("SELECT generation FROM sw_generations WHERE prefix = %s",
                                  (prefix,))).fetchone()
    return str(row[0]) if row else None


async def adopt(pg: PgConnection, prefix: str, generation: str, partitions: int) -> str:
    """PostgreSQL's generation; `generation` (Redis's, of `partitions` partitions) when it had
    none (a first snapshot, or one from before the marker)."""
    await pg.execute(ADOPT, (prefix, generation, now_ms(), partitions))
    held = await stored(pg, prefix)
    assert held is not None
    return held


async def fence(cursor: AsyncCursor[tuple[object, ...]], prefix: str, generation: str,
                lock: str = "FOR SHARE") -> int:
    """Inside a commit's transaction: go on only while PostgreSQL follows `generation` (the
    row locked `lock`); the registry's count copied last (`registry_fence`)."""
    await cursor.execute(f"SELECT generation, registry_n FROM sw_generations WHERE prefix = %s "
                         f"{lock}", (prefix,))
    row = await cursor.fetchone()
    held = str(row[0]) if row else None
    if row is None or held != generation:
        raise Fenced(f"PostgreSQL follows generation {held}, not {generation} that was read in "
                     "Redis: nothing of it was committed")
    return int(str(row[1]))


async def registry_fence(cursor: AsyncCursor[tuple[object, ...]], prefix: str, generation: str,
                         added: int) -> None:
    """Inside the registry copy's transaction: `fence`, and this Redis's registry stream has
    had at least as many entries added as when the registry was last copied (an older copy
    of Redis would put back what was removed since, and remove what was added); then that
    count is the new mark."""
    copied = await fence(cursor, prefix, generation, "FOR UPDATE")
    if added < copied:
        raise RegistryBehind(
            f"the registry stream has had {added} entries added, PostgreSQL copied it at "
            f"{copied} (Redis is behind the snapshot: an older copy of its data)")
    await cursor.execute("UPDATE sw_generations SET registry_n = %s WHERE prefix = %s",
                         (added, prefix))


class RegistryBehind(StoreLost):
    """Raised when the registry read is older than the one PostgreSQL holds: nothing of it
    was committed."""


async def replace(cursor: AsyncCursor[tuple[object, ...]], prefix: str, generation: str,
                  registry_added: int, partitions: int) -> None:
    """A restore: PostgreSQL follows `generation` (of `partitions` partitions) from now on,
    its registry copied at `registry_added` (the restored Redis's registry stream) (waits for
    a commit that holds the row)."""
    await cursor.execute("SELECT 1 FROM sw_generations WHERE prefix = %s FOR UPDATE", (prefix,))
    await cursor.execute(REPLACE, (prefix, generation, now_ms(), registry_added, partitions))


async def fill_partitions(pg: PgConnection, prefix: str, generation: str,
                          partitions: int) -> None:
    """The partition count of a row from before it was stored, by a snapshotter that
    confirmed the row's generation in its Redis (FILL_PARTITIONS)."""
    await pg.execute(FILL_PARTITIONS, (partitions, prefix, generation))


async def stored_partitions(pg: PgConnection, prefix: str) -> int | None:
    """The partition count of the Redis dataset PostgreSQL follows; None: not known (no row,
    or one from before the column that no snapshotter has confirmed since)."""
    row = await (await pg.execute("SELECT partitions FROM sw_generations WHERE prefix = %s",
                                  (prefix,))).fetchone()
    return int(str(row[0])) if row and row[0] is not None else None
