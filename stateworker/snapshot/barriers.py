"""Barrier state -> PostgreSQL (`sw_barriers`), and back at a restore.

A barrier writes no change event, so the snapshot cannot follow it in the event streams.
Instead every write of `lua/barrier.lua` adds the barrier's hash to its partition's
`barriers_changed` set and counts one more write in the hash's `w` field. Once a round, for
each partition it holds, the snapshotter reads that set (SRANDMEMBER, a batch at a time:
only what changed, never a scan), reads those hashes (HGETALL, pipelined, in parts of about
`BATCH_BYTES` by their MEMORY USAGE), upserts each part in one transaction (a row is replaced
only by one with a higher `w`), and then forgets them
(`lua/forget.lua`): each is removed from the set only if its `w` is still the one stored, so
a barrier written again (or deleted) between the read and the forget stays marked for the
next round (a delete-barrier's kept reply waits for its mark to go: snapshot/kept.py). A
crash anywhere in between leaves the set as it was: the next holder stores the same states
again (changing nothing) and forgets them.

A Redis restarted on an older copy of its data holds older barrier hashes and an older write
counter (snapshot/behind.py): each store first checks, in its transaction, that the counter is
not below the highest `w` PostgreSQL holds of the partition's barriers and that no barrier read
is older than its row (a lower `w`, or the same `w` and other fields: each write takes a new
one), else BarriersBehind and nothing is stored: a later arrival's higher `w` would replace a
newer row, and a barrier the copy lacks would delete it.

The scripts mark a change only where a snapshot follows the partition (decision 0063): its
history hash holds `FOLLOWED_FIELD`, which a service with PostgreSQL writes (`follow`) before
it serves and every round of its snapshotter, for every replica's scripts to see, whatever
their own configuration. Without PostgreSQL nothing is marked, and the set stays empty. A
barrier written before the field was (a prefix that ran without PostgreSQL, or on a version
before this one) was never marked, so a partition whose field is not yet `FOLLOWED` has its
barriers copied whole (`rescan`: every barrier hash, read after the field was written, the
rows of those gone deleted) before the field becomes `FOLLOWED`; a rescan cut short is done
again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from psycopg import AsyncCursor

from stateworker.clock import now_ms
from stateworker.errors import StoreLost, shown
from stateworker.keys import HISTORY_SNAPSHOT, PartitionKeys
from stateworker.scripts.upkeep_bindings import FORGET, forget_call
from stateworker.snapshot.behind import WHY, barriers_behind, count_command, counted, settle
from stateworker.snapshot.generation import fence
from stateworker.snapshot.names import from_pg, to_pg
from stateworker.snapshot.paged import Paged, pages
from stateworker.snapshot.rows import SCAN_COUNT, bounded, confirm
from stateworker.snapshot.tables import PgConnection, commit_count
from stateworker.state.core.store import RedisState
from stateworker.state.generation import PARTITION_FIELD
from stateworker.transport.plans import checked_pipeline, pipeline

UPSERT = """
INSERT INTO sw_barriers AS b (prefix, id, partition, fields, exact, w, expires_ms)
VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s)
ON CONFLICT (prefix, id) DO UPDATE SET
    partition = excluded.partition, fields = excluded.fields, exact = excluded.exact,
    w = excluded.w, expires_ms = excluded.expires_ms
WHERE b.w < excluded.w
"""
# A barrier deleted (or expired) since it was marked changed: its row goes too. One made again
# meanwhile stays marked (forget.lua) and is stored at the next round, newer (its `w`).
DELETE = "DELETE FROM sw_barriers WHERE prefix = %s AND id = %s"
PRUNE = "DELETE FROM sw_barriers WHERE prefix = %s AND expires_ms <= %s"
# The highest `w` of each partition's barriers not expired (a restore leaves the expired out
# and sets the counter from the rest: `restore`); one index probe each (0007).
HIGHEST = """
SELECT p, (SELECT max(w) FROM sw_barriers WHERE prefix = %s AND partition = p
           AND (expires_ms IS NULL OR expires_ms > %s))
FROM unnest(%s::integer[]) AS p
"""
STORED = "SELECT id, w, exact FROM sw_barriers WHERE prefix = %s AND id = ANY(%s)"
# A rescan's barriers gone from Redis: rows of the partition it did not find, numbered at most
# the write counter read before its scan (one written since, which the scan may miss, is
# marked and stored by the next `store_changed`).
VANISHED = """
DELETE FROM sw_barriers WHERE prefix = %s AND partition = %s AND w <= %s AND NOT (id = ANY(%s))
"""

BATCH = 1000  # barriers read and stored per round and partition, at most
# ... read and committed in parts of about this many bytes (a barrier holds up to a 2 MiB
# payload: 1,000 of them read at once were ~2 GiB). As a batch (rows.BATCH_BYTES).
BATCH_BYTES = 8 << 20
# The partition's history hash field (keys.PartitionKeys.history) that says a snapshot follows
# its barriers: `RESCAN` until its barriers have been copied whole, then `FOLLOWED`. Read by
# lua/includes/barriermarks.lua by this name.
FOLLOWED_FIELD = HISTORY_SNAPSHOT
RESCAN, FOLLOWED = "rescan", "on"


class BarriersBehind(StoreLost):
    """Raised when the barriers read are older than those PostgreSQL holds (an older copy of
    Redis): nothing of them was stored."""


@dataclass(frozen=True, slots=True)
class BarrierRow:
    """One barrier's hash as read (HGETALL), with its write count."""

    id: str
    fields: dict[bytes, bytes]

    @property
    def w(self) -> int:
        return int(self.fields.get(b"w", b"0"))

    def params(self, prefix: str, partition: int) -> tuple[object, ...]:
        exact = msgspec.msgpack.encode(self.fields)
        try:
            texts = {k.decode(): v.decode() for k, v in self.fields.items()}
            as_json = None if any("\0" in k or "\0" in v for k, v in texts.items()) \
                else msgspec.json.encode(texts).decode()
        except UnicodeDecodeError:
            as_json = None
        expires = self.fields.get(b"z")
        return (prefix, to_pg(self.id), partition, as_json, exact, self.w,
                None if expires is None else int(expires))


async def store_changed(state: RedisState, pg: PgConnection, prefix: str, partition: int,
                        generation: str, reads: dict[int, int]) -> int:
    """Store the partition's changed barriers (up to BATCH of them) and forget them, in parts
    of about BATCH_BYTES (`sizes`), each read and committed on its own; how many were stored.
    Each read from a Redis whose partition marker is `generation` before and after (Fenced if
    not), and not behind PostgreSQL's barriers (BarriersBehind if so: module docstring); the
    read counted against the count PostgreSQL holds (`reads`, raised to the read's: behind.py)."""
    keys = state.keys.partition(partition)
    names: list[bytes] = await state.conn.execute("SRANDMEMBER", keys.barriers_changed, BATCH)
    if not names:
        return 0
    for part in bounded(await sizes(state, names), BATCH_BYTES):
        await _store_changed(state, pg, prefix, partition, generation, reads, names[part])
    return len(names)


async def sizes(state: RedisState, names: list[bytes]) -> list[int | None]:
    """The bytes each barrier hash takes (MEMORY USAGE, every field counted; None: gone)."""
    replies: list[int | None] = await state.conn.pipeline(
        [["MEMORY", "USAGE", name, "SAMPLES", 0] for name in names])
    return replies


async def _store_changed(state: RedisState, pg: PgConnection, prefix: str, partition: int,
                         generation: str, reads: dict[int, int], names: list[bytes]) -> None:
    keys = state.keys.partition(partition)
    marker: list[Any] = ["HGET", keys.history, PARTITION_FIELD]
    hashes: list[list[Any]] = [["HGETALL", name] for name in names]
    stored = reads.get(partition, 0)
    before, counter, *replies, after, count = await pipeline(state.conn, state.library, [
        marker, ["GET", keys.barrier_writes], *hashes, marker,
        count_command(state, keys.snapshot_reads, stored)])
    confirm(keys, before, generation)
    confirm(keys, after, generation)
    read = counted(partition, count, stored)
    await settle(state)
    found = [BarrierRow(keys.barrier_id_of(name), dict(zip(flat[::2], flat[1::2], strict=True)))
             for name, flat in zip(names, replies, strict=True) if flat]
    gone = [keys.barrier_id_of(name) for name, flat in zip(names, replies, strict=True)
            if not flat]
    async with pg.transaction(), pg.cursor() as cursor:
        await fence(cursor, prefix, generation)
        await _not_behind(cursor, prefix, partition, int(counter or 0), found)
        if found:
            await cursor.executemany(UPSERT, [b.params(prefix, partition) for b in found])
        if gone:
            await cursor.executemany(DELETE, [(prefix, to_pg(i)) for i in gone])
        await commit_count(cursor, prefix, partition, read)
    reads[partition] = read
    await forget(state, keys, names, {keys.barrier(b.id): b.fields.get(b"w", b"").decode()
                                      for b in found})


async def follow(state: RedisState, partitions: list[int]) -> list[int]:
    """A snapshot follows the barriers of `partitions` from now on: their history hash's
    `FOLLOWED_FIELD` written (`RESCAN`) where it is absent, so every barrier write marks its
    change (module docstring). Those whose barriers are not yet copied whole: their rescan is
    due."""
    parts = [state.keys.partition(n) for n in partitions]
    replies = await checked_pipeline(state.conn, [
        command for p in parts for command in (["HSETNX", p.history, FOLLOWED_FIELD, RESCAN],
                                               ["HGET", p.history, FOLLOWED_FIELD])],
        "snapshot: follow the barriers")
    return [n for n, value in zip(partitions, replies[1::2], strict=True)
            if value != FOLLOWED.encode()]


async def rescan(state: RedisState, pg: PgConnection, prefix: str, partition: int,
                 generation: str, reads: dict[int, int]) -> int:
    """Every barrier of the partition stored (SCAN, then HGETALL in parts of about
    BATCH_BYTES, each upserted as it is read, all in one transaction), the rows of those gone
    deleted, then the partition `FOLLOWED`; how many were stored. Called after `follow`: what
    the scan misses was written after it, so it is marked. Fenced, BarriersBehind and the read
    counted as in `store_changed`."""
    keys = state.keys.partition(partition)
    marker: list[Any] = ["HGET", keys.history, PARTITION_FIELD]
    held, counter = await checked_pipeline(state.conn, [marker, ["GET", keys.barrier_writes]],
                                           "snapshot: barriers rescanned")
    confirm(keys, held, generation)
    written = int(counter or 0)
    ids: list[str] = []
    stored = reads.get(partition, 0)
    async with pg.transaction(), pg.cursor() as cur:
        await fence(cur, prefix, generation)
        scan: Any = b"0"
        while True:
            scan, names = await state.conn.execute("SCAN", scan, "MATCH",
                                                   keys.barrier_prefix + "*", "COUNT",
                                                   SCAN_COUNT, "TYPE", "hash")
            for part in bounded(await sizes(state, names) if names else [], BATCH_BYTES):
                *replies, after = await state.conn.pipeline(
                    [*(["HGETALL", name] for name in names[part]), marker])
                confirm(keys, after, generation)
                found = [BarrierRow(keys.barrier_id_of(name),
                                    dict(zip(flat[::2], flat[1::2], strict=True)))
                         for name, flat in zip(names[part], replies, strict=True) if flat]
                await _not_behind(cur, prefix, partition, written, found)
                if found:
                    await cur.executemany(UPSERT, [b.params(prefix, partition) for b in found])
                ids += [b.id for b in found]
            if scan in (b"0", "0"):
                break
        after, count = await pipeline(state.conn, state.library, [
            marker, count_command(state, keys.snapshot_reads, stored)])
        confirm(keys, after, generation)
        read = counted(partition, count, stored)
        await settle(state)
        await cur.execute(VANISHED, (prefix, partition, written, [to_pg(i) for i in ids]))
        await commit_count(cur, prefix, partition, read)
    reads[partition] = read
    await state.conn.execute("HSET", keys.history, FOLLOWED_FIELD, FOLLOWED)
    return len(ids)


async def highest_w(pg: PgConnection, prefix: str, partitions: list[int]) -> dict[int, int]:
    """The highest `w` PostgreSQL holds of each partition's barriers (those it holds any of)."""
    cursor = await pg.execute(HIGHEST, (prefix, now_ms(), partitions))
    return {int(str(p)): int(str(w)) for p, w in await cursor.fetchall() if w is not None}


async def _not_behind(cursor: AsyncCursor[tuple[object, ...]], prefix: str, partition: int,
                      counter: int, found: list[BarrierRow]) -> None:
    """In the store's transaction: BarriersBehind when the partition's write counter read
    (`counter`) is below the highest `w` stored, or a barrier read is older than its row."""
    await cursor.execute(HIGHEST, (prefix, now_ms(), [partition]))
    row = await cursor.fetchone()
    reason = barriers_behind(partition, counter, int(str(row[1])) if row and row[1] else 0)
    if reason is None and found:
        await cursor.execute(STORED, (prefix, [to_pg(b.id) for b in found]))
        stored = {from_pg(str(i)): (int(str(w)), bytes(e))  # type: ignore[call-overload]
                  for i, w, e in await cursor.fetchall()}
        for b in found:
            w, exact = stored.get(b.id, (0, b""))
            # (Every barrier write takes a new `w`: the same one is the same state.)
            if w > b.w:
                reason = (f"partition {partition}'s barrier {shown(b.id)} is at write {b.w}, "
                          f"PostgreSQL holds it at write {w}")
            elif w == b.w and msgspec.msgpack.decode(exact) != b.fields:
                reason = (f"partition {partition}'s barrier {shown(b.id)} is at write {w} "
                          "with other fields than PostgreSQL holds of that write")
            if reason is not None:
                break
    if reason is not None:
        raise BarriersBehind(f"{reason} ({WHY})")


async def prune(pg: PgConnection, prefix: str) -> None:
    """Delete the rows of completed barriers past their expiry (Redis dropped their hashes
    without a change to follow)."""
    await pg.execute(PRUNE, (prefix, now_ms()))


async def forget(state: RedisState, keys: PartitionKeys, names: list[bytes],
                 stored: dict[str, str]) -> None:
    """Unmark the barriers still as stored: at the write count stored (`stored`), or absent
    and stored as gone (one deleted since it was read stays marked: its deletion is stored
    at the next round)."""
    texts = [name.decode() for name in names]
    call = forget_call(keys.barriers_changed, texts, [stored.get(t, "") for t in texts])
    reply = await pipeline(state.conn, state.library, [FORGET.command(state.library, *call)])
    FORGET.read(reply[0])


# The barriers a restore puts back: those not expired yet (paged.pages: a hash holds up to a
# 2 MiB payload).
STORED_PAGES = Paged("sw_barriers", "id, exact", 1, "octet_length(exact)",
                     "(expires_ms IS NULL OR expires_ms > %s)")


async def restore(state: RedisState, pg: PgConnection) -> int:
    """A restore: every barrier of the prefix in PostgreSQL not expired yet put back
    (`restore_commands`), a page at a time, then each partition's write counter at the highest
    `w` put back, so the next write numbers above what PostgreSQL holds; how many."""
    highest: dict[str, int] = {}
    restored = 0
    async for page in pages(pg, STORED_PAGES, state.settings.prefix, (now_ms(),)):
        stored = [(from_pg(str(i)), bytes(e)) for i, e in page]  # type: ignore[call-overload]
        await checked_pipeline(state.conn, restore_commands(state, stored), "restore")
        for barrier_id, exact in stored:
            w = int(msgspec.msgpack.decode(exact, type=dict[bytes, bytes]).get(b"w", b"0"))
            counter = state.keys.barrier_partition(barrier_id).barrier_writes
            highest[counter] = max(highest.get(counter, 0), w)
        restored += len(stored)
    if highest:
        await checked_pipeline(state.conn, [["SET", counter, w] for counter, w
                                            in sorted(highest.items())], "restore")
    return restored


def restore_commands(state: RedisState, stored: list[tuple[str, bytes]]) -> list[list[Any]]:
    """The writes that put the stored barrier hashes back exactly (write count and expiry
    included): a hash Redis still has of the barrier is replaced, not merged field by field."""
    commands: list[list[Any]] = []
    for barrier_id, exact in stored:
        fields = msgspec.msgpack.decode(exact, type=dict[bytes, bytes])
        flat = [part for pair in fields.items() for part in pair]
        name = state.keys.barrier_partition(barrier_id).barrier(barrier_id)
        index = state.keys.barrier_partition(barrier_id).barriers
        commands += [["DEL", name], ["HSET", name, *flat],
                     ["ZADD", index, int(fields[b"z"]) if b"z" in fields else "+inf", name]]
        if b"z" in fields:
            commands.append(["PEXPIREAT", name, int(fields[b"z"])])
    return commands
