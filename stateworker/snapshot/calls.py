"""Bus call records -> PostgreSQL (`sw_calls`), and back at a restore.

An entry script that changes an entry for a bus call (with the snapshot on) appends the call's
record, its revision and its time to the partition's `unsaved_calls` stream, in the same
script as the change (lua/includes/entry.lua). After each batch it commits, and once a round,
the snapshotter stores the records whose revision its committed position has passed (only
those: a record without its change would answer a retry of a change the restore lost) and
deletes them from the stream (XDEL). A crash in between stores them again, which changes
nothing. A record older than the dedupe window is dropped unstored. Rows older than the
window are pruned by the holder of partition 0, once a round.

At a restore, the records of the last window go back into the slices the scripts wrote them
to (lua/includes/records.lua), expiring when they would have: a retry of a call the snapshot
holds gets its recorded reply and is not applied again. Calls that changed nothing (a
conflict, a diff left unchanged) are not stored: run again after a restore they apply at most
once, though their reply may differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stateworker.clock import now_ms
from stateworker.events.model import revision_of
from stateworker.scripts.bindings import DIGEST_BYTES, RECORD_SLICES, slice_ms
from stateworker.snapshot.tables import PgConnection, StoredPosition
from stateworker.state.store import RedisState

UPSERT = """
INSERT INTO sw_calls (prefix, field, partition, value, revision_ms, revision_seq, at_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (prefix, field) DO NOTHING
"""

BATCH = 1000  # records read and stored per trip


@dataclass(frozen=True, slots=True)
class CallRow:
    field: bytes
    value: bytes
    revision: tuple[int, int]
    at_ms: int


def _rows(entries: list[Any], upto: tuple[int, int]) -> tuple[list[CallRow], list[bytes]]:
    """The records the position has passed, and every entry done with (those and expired)."""
    rows: list[CallRow] = []
    done: list[bytes] = []
    for entry_id, flat in entries:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        revision = revision_of(fields[b"r"])
        if revision > upto:
            break  # (in stream order: the later ones are later changes too)
        rows.append(CallRow(fields[b"f"], fields[b"v"], revision, int(fields[b"t"])))
        done.append(entry_id)
    return rows, done


async def store_unsaved(state: RedisState, pg: PgConnection, prefix: str, partition: int,
                        position: StoredPosition) -> int:
    """Store the partition's unsaved records up to `position` (committed); how many."""
    stream = state.keys.partition(partition).unsaved_calls
    upto, stored = revision_of(position.id), 0
    oldest = now_ms() - state.settings.dedupe_window_ms
    while True:
        entries = await state.conn.execute("XRANGE", stream, "-", "+", "COUNT", BATCH)
        rows, done = _rows(entries or [], upto)
        if not done:
            return stored
        live = [r for r in rows if r.at_ms >= oldest]
        if live:
            async with pg.transaction(), pg.cursor() as cursor:
                await cursor.executemany(UPSERT, [
                    (prefix, r.field, partition, r.value, *r.revision, r.at_ms) for r in live])
        await state.conn.execute("XDEL", stream, *done)
        stored += len(live)
        if len(done) < BATCH:
            return stored


async def prune(pg: PgConnection, prefix: str, window_ms: int) -> None:
    """Rows older than the dedupe window: no retry can need them."""
    await pg.execute("DELETE FROM sw_calls WHERE prefix = %s AND at_ms < %s",
                     (prefix, now_ms() - window_ms))


async def restore(state: RedisState, pg: PgConnection) -> int:
    """The records of the last window back into Redis; how many."""
    settings, keys = state.settings, state.keys
    ms, now = slice_ms(settings), now_ms()
    rows = await (await pg.execute(
        "SELECT field, partition, value, at_ms FROM sw_calls WHERE prefix = %s AND at_ms >= %s",
        (settings.prefix, now - settings.dedupe_window_ms))).fetchall()
    commands: list[list[Any]] = []
    restored = 0
    for row in rows:
        field, partition, value = bytes(row[0]), int(row[1]), bytes(row[2])  # type: ignore[call-overload]
        slice_ = int(row[3]) // ms  # type: ignore[call-overload]
        keep = (slice_ + RECORD_SLICES + 1) * ms - now  # (records.lua's expiry of the slice)
        if keep <= 0:
            continue
        names = [(keys.call_ids(field, slice_), value)]
        if state.cluster:  # the record in its partition, the id bound at its home
            names = [(keys.partition(partition).call_records(slice_), value)]
            if keys.id_home(field) != partition:  # (at home, the record binds it)
                names.append((keys.binding(field, slice_, True), value[:DIGEST_BYTES]))
        for name, held in names:
            commands += [["HSET", name, field, held], ["PEXPIRE", name, keep]]
        restored += 1
    for start in range(0, len(commands), 2 * BATCH):
        await state.conn.pipeline(commands[start:start + 2 * BATCH])
    return restored
