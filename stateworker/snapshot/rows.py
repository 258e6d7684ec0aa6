"""Redis entries -> snapshot rows: a batch of a partition's events, bounded in count and in
bytes, read with the entries it changed and those of the transactions after the batch that
wrote one of them, in one script (snaprows.lua; their stored form: state/kv/packed.py), and a
full scan of one partition's entries (a rescan), in parts bounded the same way."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from stateworker.events.model import revision_of
from stateworker.keys import PartitionKeys, split_member
from stateworker.reactive.trimming import StreamInfo
from stateworker.scripts.upkeep_bindings import SNAPROWS, snaprows_call
from stateworker.snapshot.behind import WHY, count_command, counted, settle, stream_behind
from stateworker.snapshot.generation import Fenced
from stateworker.snapshot.tables import Gone, Row, StoredPosition
from stateworker.state.core.store import RedisState
from stateworker.state.generation import PARTITION_FIELD
from stateworker.state.kv.packed import unpack
from stateworker.transport.plans import pipeline

log = logging.getLogger("stateworker.snapshot")

BATCH = 1000  # events of a batch, at most (a transaction is never cut: it may end past them)
# ... and bytes of a batch, about: of the events snaprows.lua reads and the entries it returns
# (an event holds two values of up to max_value_bytes, an entry one). Counted in Redis, before
# the reply is made: after a PostgreSQL outage a count alone read up to ~2 GiB of events and
# ~1 GiB of entries in one script and one reply. 8 MiB is what one call's script may spend
# (max_call_bytes' default, ~100 ms of Lua) and what a history read holds (events/history.py):
# a batch holds Redis no longer than the largest call does, the service holds a few times the
# budget (the reply, its rows, their parameters), and at the largest values (~3 MiB an event
# and its entry) a batch still carries a few changes per PostgreSQL commit.
BATCH_BYTES = 8 << 20
SCAN_COUNT = 1000
# Events after a batch examined for the transactions its rows may hold (snaprows.lua), at
# most, and about as many bytes of them: the snapshot's usual lag is far less; past it
# (catching up) a transaction may be cut. Each batch pays for its tail: 4,000 events made a
# catch-up after 30 s without PostgreSQL under load ~15% slower (test_faults), 1,000 ~5%.
TAIL_BUDGET = 1000
TAIL_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Batch:
    """What a batch commits: its rows, its deletes, the count of its read (behind.py), its
    last event id and its number of events (0: none after the position), and whether events
    follow it (it ended at BATCH or BATCH_BYTES)."""

    rows: list[Row]
    gone: list[Gone]
    read: int
    last: str
    events: int
    more: bool


def row_of(scope: str, key: str, stored: bytes | None) -> Row | None:
    """The row of an entry's GET reply; None when the entry is absent."""
    if stored is None:
        return None
    e = unpack(stored)
    return Row(scope=scope, key=key, value_text=e.value.decode(), version=e.version,
               hash=e.hash, topic=e.topic, created_ms=e.created, updated_ms=e.updated,
               expires_ms=e.expires, updated_by=e.by, revision=e.revision, plain=e.plain)


def confirm(partition: PartitionKeys, held: bytes | None, generation: str) -> None:
    """Go on only while the partition's marker (`held`, as read) is `generation`."""
    if held is None or held.decode() != generation:
        raise Fenced(f"the generation marker of {partition.tag} is "
                     f"{held.decode() if held else 'gone'}, not {generation}")


async def read_batch(state: RedisState, partition: PartitionKeys, generation: str,
                     at: tuple[int, StoredPosition], reads: int) -> Batch:
    """The batch after the position (at most BATCH events, about BATCH_BYTES, never ending
    inside a transaction) and the current entries of the keys it changed (keyed by their last
    change's revision in it), with those of every key a transaction after the batch wrote
    together with one of them (snaprows.lua: an entry read as it is now may hold such a
    change, and PostgreSQL must get the transaction whole); rows for those that exist, `Gone`
    for those that do not; from a Redis whose partition marker is `generation` (a wiped one
    reads every key gone) and whose stream is not behind `at` (the partition's number and
    the position the snapshotter holds) when they are read, else Fenced. The second check is
    here, in the read's own pipeline, not only in the round: the connection reconnects
    without a word, so a Redis restarted on an older copy of its data (same markers) since
    the round would hand over its older entries (snapshot/behind.py). The read is counted
    last (`counted`, against `reads`, the count PostgreSQL holds): its count goes with the
    rows (`strict`: once confirmed, `settle`)."""
    number, position = at
    held, info, kept, reply, count = await pipeline(state.conn, state.library, [
        ["HGET", partition.history, PARTITION_FIELD],
        ["XINFO", "STREAM", partition.events],
        ["XRANGE", partition.events, position.id, position.id],
        SNAPROWS.command(state.library, *snaprows_call(
            partition, position.id, BATCH, BATCH_BYTES, TAIL_BUDGET, TAIL_BYTES)),
        count_command(state, partition.snapshot_reads, reads)])
    confirm(partition, held, generation)
    behind = stream_behind(number, position, StreamInfo(info), bool(kept))
    if behind is not None:
        raise Fenced(f"{behind} ({WHY})")
    counted_read = counted(number, count, reads)
    await settle(state)
    read = SNAPROWS.read(reply)
    if not read.complete:
        log.warning("partition %d: the snapshot is more than %d events (or %d bytes) behind; "
                    "a transaction past its batch may reach PostgreSQL in parts until it "
                    "catches up", number, TAIL_BUDGET, TAIL_BYTES,
                    extra={"event": "snapshot.tail_unchecked", "partition": number})
    rows: list[Row] = []
    gone: list[Gone] = []
    for scope, key, revision, fields in read.rows:
        row = row_of(scope, key, fields)
        if row is None:
            gone.append(Gone(scope, key, revision_of(revision)))
        else:
            rows.append(row)
    return Batch(rows, gone, counted_read, read.last or position.id, read.events, read.more)


def bounded(sizes: Sequence[int | None], budget: int) -> Iterator[slice]:
    """`sizes` (None: 0) in consecutive runs, each ending after the item that reaches `budget`:
    one item at least, however large."""
    start, total = 0, 0
    for i, size in enumerate(sizes):
        total += size or 0
        if total >= budget:
            yield slice(start, i + 1)
            start, total = i + 1, 0
    if start < len(sizes):
        yield slice(start, len(sizes))


async def scan_partition(state: RedisState, partition: PartitionKeys, generation: str
                         ) -> AsyncIterator[list[Row]]:
    """Every entry of a partition, in parts of at most SCAN_COUNT entries and about
    BATCH_BYTES (SCAN, their sizes, then GET in a pipeline per part: a partition may hold far
    more than fits in memory), each read from a Redis whose partition marker is `generation`
    (Fenced when it is not). Counted once it is done (`count_scan`)."""
    marker: list[Any] = ["HGET", partition.history, PARTITION_FIELD]
    confirm(partition, await state.conn.execute(*marker), generation)
    prefix = partition.entry_prefix.encode()
    cursor: Any = b"0"
    while True:
        cursor, names = await state.conn.execute("SCAN", cursor, "MATCH",
                                                 partition.entry_prefix + "*",
                                                 "COUNT", SCAN_COUNT, "TYPE", "string")
        sizes = await state.conn.pipeline([["STRLEN", name] for name in names]) if names else []
        for part in bounded(sizes, BATCH_BYTES):
            held, *replies = await state.conn.pipeline(
                [marker, *(["GET", name] for name in names[part])])
            confirm(partition, held, generation)
            found = [row_of(*split_member(name[len(prefix):]), fields)
                     for name, fields in zip(names[part], replies, strict=True)]
            yield [row for row in found if row is not None]
        if cursor in (b"0", "0"):
            return


async def count_scan(state: RedisState, partition: PartitionKeys, at: tuple[int, int]) -> int:
    """The count of a rescan's read, once it is done (`at`: the partition's number and the
    count of reads PostgreSQL holds; Fenced when Redis's is below: snapshot/behind.py)."""
    number, reads = at
    reply = await pipeline(state.conn, state.library,
                           [count_command(state, partition.snapshot_reads, reads)])
    read = counted(number, reply[0], reads)
    await settle(state)
    return read
