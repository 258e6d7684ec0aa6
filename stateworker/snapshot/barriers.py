"""Barrier state -> PostgreSQL (`sw_barriers`), and back at a restore.

A barrier writes no change event, so the snapshot cannot follow it in the event streams.
Instead every write of `lua/barrier.lua` adds the barrier's hash to its partition's
`barriers_changed` set and counts one more write in the hash's `w` field. Once a round, for
each partition it holds, the snapshotter reads that set (SRANDMEMBER, a batch at a time:
only what changed, never a scan), reads those hashes (HGETALL, pipelined), upserts them in
one transaction (a row is replaced only by one with a higher `w`), and then forgets them
(`lua/forget.lua`): each is removed from the set only if its `w` is still the one stored, so
a barrier written again between the read and the forget stays marked for the next round. A
crash anywhere in between leaves the set as it was: the next holder stores the same states
again (changing nothing) and forgets them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.keys import PartitionKeys
from stateworker.scripts.bindings import FORGET, forget_call
from stateworker.snapshot.generation import fence
from stateworker.snapshot.names import from_pg, to_pg
from stateworker.snapshot.rows import confirm
from stateworker.snapshot.tables import PgConnection
from stateworker.state.core.store import RedisState
from stateworker.state.generation import PARTITION_FIELD
from stateworker.transport.plans import pipeline

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

BATCH = 1000  # barriers read and stored per round and partition, at most


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
                        generation: str) -> int:
    """Store the partition's changed barriers and forget them; how many were stored. Read
    from a Redis whose partition marker is `generation` before and after (Fenced if not)."""
    keys = state.keys.partition(partition)
    names: list[bytes] = await state.conn.execute("SRANDMEMBER", keys.barriers_changed, BATCH)
    if not names:
        return 0
    marker: list[Any] = ["HGET", keys.history, PARTITION_FIELD]
    reads: list[list[Any]] = [["HGETALL", name] for name in names]
    before, *replies, after = await state.conn.pipeline([marker, *reads, marker])
    confirm(keys, before, generation)
    confirm(keys, after, generation)
    found = [BarrierRow(keys.barrier_id_of(name), dict(zip(flat[::2], flat[1::2], strict=True)))
             for name, flat in zip(names, replies, strict=True) if flat]
    gone = [keys.barrier_id_of(name) for name, flat in zip(names, replies, strict=True)
            if not flat]
    async with pg.transaction(), pg.cursor() as cursor:
        await fence(cursor, prefix, generation)
        if found:
            await cursor.executemany(UPSERT, [b.params(prefix, partition) for b in found])
        if gone:
            await cursor.executemany(DELETE, [(prefix, to_pg(i)) for i in gone])
    await forget(state, keys, names, {keys.barrier(b.id): b.w for b in found})
    return len(names)


async def prune(pg: PgConnection, prefix: str) -> None:
    """Delete the rows of completed barriers past their expiry (Redis dropped their hashes
    without a change to follow)."""
    await pg.execute(PRUNE, (prefix, now_ms()))


async def forget(state: RedisState, keys: PartitionKeys, names: list[bytes],
                 stored: dict[str, int]) -> None:
    """Unmark the barriers still at the write count stored (absent ones: nothing to store)."""
    texts = [name.decode() for name in names]
    call = forget_call(keys.barriers_changed, texts, [str(stored.get(t, "")) for t in texts])
    reply = await pipeline(state.conn, state.library, [FORGET.command(state.library, *call)])
    FORGET.read(reply[0])


async def stored_barriers(pg: PgConnection, prefix: str) -> list[tuple[str, bytes]]:
    """(id, exact msgpack) of every barrier of the prefix in PostgreSQL not expired yet."""
    cursor = await pg.execute("SELECT id, exact FROM sw_barriers WHERE prefix = %s AND "
                              "(expires_ms IS NULL OR expires_ms > %s)", (prefix, now_ms()))
    return [(from_pg(str(i)), bytes(e))  # type: ignore[call-overload]
            for i, e in await cursor.fetchall()]


def restore_commands(state: RedisState, stored: list[tuple[str, bytes]]) -> list[list[Any]]:
    """The writes that put the stored barrier hashes back exactly (write count and expiry
    included): a hash Redis still has of the barrier is replaced, not merged field by field."""
    commands: list[list[Any]] = []
    for barrier_id, exact in stored:
        fields = msgspec.msgpack.decode(exact, type=dict[bytes, bytes])
        flat = [part for pair in fields.items() for part in pair]
        name = state.keys.barrier_partition(barrier_id).barrier(barrier_id)
        commands += [["DEL", name], ["HSET", name, *flat]]
        if b"z" in fields:
            commands.append(["PEXPIREAT", name, int(fields[b"z"])])
    return commands


def counter_commands(state: RedisState, stored: list[tuple[str, bytes]]) -> list[list[Any]]:
    """Each partition's barrier write counter at the highest `w` of every barrier put back, so
    the next write numbers above what PostgreSQL holds."""
    highest: dict[str, int] = {}
    for barrier_id, exact in stored:
        w = int(msgspec.msgpack.decode(exact, type=dict[bytes, bytes]).get(b"w", b"0"))
        counter = state.keys.barrier_partition(barrier_id).barrier_writes
        highest[counter] = max(highest.get(counter, 0), w)
    return [["SET", counter, w] for counter, w in sorted(highest.items())]
