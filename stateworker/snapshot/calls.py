"""Bus call records -> PostgreSQL (`sw_calls`), and back at a restore.

An entry script that changes an entry for a bus call (with the snapshot on) appends the call's
record, the revision of its first change and its time to the partition's `unsaved_calls`
stream, in the same script as the change (lua/includes/entry.lua). A change must never reach
PostgreSQL without the record that answers its retry, or a restore would hold the change and
apply the retry again. So each batch the snapshotter commits carries, in the same
transaction, every unsaved record whose first change is at or before the newest change the
batch holds (`bound`: the batch's position, or a row it read that is newer, since a row is
read as it is now). The records are read after the rows, so the record of every change a row
shows is in the stream by then; the commit reads them itself, a page at a time
(`Unsaved.pages`, snappage.lua): they may be every later change of a key the batch read,
never all in memory. A record may so reach PostgreSQL a little before the last of its
changes (a later key of the same call): a restore from that moment lost that part of the
call with the rest of the snapshot's lag, and its retry is answered from the record.
After the commit the records are deleted from the stream (XDEL); a crash in between stores
them again, which changes nothing. A record older than the dedupe window is dropped
unstored; rows older than it are pruned by the holder of partition 0, once a round.

At a restore, the records of the last window go back into the slices the scripts wrote them
to (lua/includes/records.lua), expiring when they would have: a retry of a call the snapshot
holds gets its recorded reply and is not applied again. Calls that changed nothing (a
conflict, a diff left unchanged) are not stored: run again after a restore they apply at most
once, though their reply may differ."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from stateworker.clock import now_ms
from stateworker.events.model import Revision, revision_of
from stateworker.scripts.bindings import DIGEST_BYTES, RECORD_SLICES, slice_ms
from stateworker.scripts.upkeep_bindings import SNAPPAGE, snappage_call
from stateworker.snapshot.generation import Fenced
from stateworker.snapshot.paged import Paged, pages
from stateworker.snapshot.tables import CallRow, PgConnection, StoredPosition, apply_records
from stateworker.state.core.store import RedisState
from stateworker.state.generation import PARTITION_FIELD
from stateworker.transport.plans import checked_pipeline, pipeline

BATCH = 1000  # records read per trip, at most
# ... and bytes of them, about (snappage.lua): a record holds its call's reply, values and all.
# The records a commit carries are read a page at a time inside its transaction (`Unsaved`):
# those of rows read as they are now may be every later change of a hot key, gigabytes after
# a PostgreSQL outage, never all in memory at once. 8 MiB: as a batch (rows.BATCH_BYTES).
BATCH_BYTES = 8 << 20


@dataclass(slots=True)
class Unsaved:
    """The unsaved records a commit carries (`read_unsaved`), read a page at a time by the
    commit (`pages`, inside its transaction), and the stream entries it is done with once
    committed (`done`: those and the expired ones; `stored`: how many went to PostgreSQL)."""

    state: RedisState
    partition: int
    bound: Revision
    generation: str
    held: Mapping[str, Revision] = field(default_factory=dict)
    done: list[bytes] = field(default_factory=list)
    stored: int = 0

    async def pages(self) -> AsyncIterator[list[CallRow]]:
        """The records whose first change the commit holds, from a Redis of `generation`
        (checked with each page: Fenced when it is not): those at or before `bound` (the
        commit's position), and those whose first change's entry is among `held` (member ->
        the revision of the row read) at or after that change. The others stay in the stream
        for a later commit: a record committed before its change would answer the retry of a
        call whose change a restore lost (without re-applying it). Each page at most BATCH
        records and about BATCH_BYTES (snappage.lua)."""
        keys = self.state.keys.partition(self.partition)
        newest = max([self.bound, *self.held.values()])
        oldest = now_ms() - self.state.settings.dedupe_window_ms
        start = "-"
        while True:
            reply, marker = await pipeline(self.state.conn, self.state.library, [
                SNAPPAGE.command(self.state.library, *snappage_call(
                    keys.unsaved_calls, start, BATCH, BATCH_BYTES)),
                ["HGET", keys.history, PARTITION_FIELD]])
            if marker is None or marker.decode() != self.generation:
                raise Fenced(f"partition {self.partition}'s generation marker is no longer "
                             f"{self.generation}")
            page = SNAPPAGE.read(reply)
            rows: list[CallRow] = []
            for entry_id, flat in page.entries:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                revision = revision_of(fields[b"r"])
                if revision > newest:  # (in stream order: the later ones are later changes too)
                    yield self._went(rows)
                    return
                if revision > self.bound and not _held(fields.get(b"k"), revision, self.held):
                    continue  # (its first change is past what this commit holds)
                at_ms = int(fields[b"t"])
                if at_ms >= oldest:
                    rows.append(CallRow(fields[b"f"], fields[b"v"], revision, at_ms))
                self.done.append(entry_id)
            yield self._went(rows)
            if not page.more or not page.entries:
                return
            start = "(" + page.entries[-1][0].decode()

    def _went(self, rows: list[CallRow]) -> list[CallRow]:
        self.stored += len(rows)
        return rows


def read_unsaved(state: RedisState, partition: int, bound: Revision, generation: str,
                 held: Mapping[str, Revision] | None = None) -> Unsaved:
    """The partition's unsaved records a commit at `bound` holding the rows `held` carries:
    read by the commit itself (`Unsaved.pages`), after the rows were."""
    return Unsaved(state, partition, bound, generation, dict(held or {}))


def _held(member: bytes | None, revision: tuple[int, int],
          held: Mapping[str, tuple[int, int]]) -> bool:
    """Whether the row of `member` (a record's first change's entry; None: a record of a
    version before the field, held with the newest row) holds the change at `revision`."""
    if member is None:
        return True
    row = held.get(member.decode(errors="surrogateescape"))
    return row is not None and row >= revision


async def forget_saved(state: RedisState, partition: int, unsaved: Unsaved) -> None:
    """After the commit: the records PostgreSQL holds leave the stream."""
    stream = state.keys.partition(partition).unsaved_calls
    for start in range(0, len(unsaved.done), BATCH):
        await state.conn.execute("XDEL", stream, *unsaved.done[start:start + BATCH])


async def store_unsaved(state: RedisState, pg: PgConnection, prefix: str, partition: int,
                        position: StoredPosition, generation: str) -> int:
    """Once a round: records up to the committed `position` that no batch carried (none,
    unless a batch failed between its commit and the XDEL); how many."""
    unsaved = read_unsaved(state, partition, revision_of(position.id), generation)
    await apply_records(pg, prefix, partition, unsaved.pages(), generation)
    await forget_saved(state, partition, unsaved)
    return unsaved.stored


async def prune(pg: PgConnection, prefix: str, window_ms: int) -> None:
    """Rows older than the dedupe window: no retry can need them."""
    await pg.execute("DELETE FROM sw_calls WHERE prefix = %s AND at_ms < %s",
                     (prefix, now_ms() - window_ms))


# The records a restore puts back, those of the last window (paged.pages: a record holds its
# call's reply, values and all).
RECORD_PAGES = Paged("sw_calls", "field, partition, value, at_ms", 1, "octet_length(value)",
                     "at_ms >= %s")


async def restore(state: RedisState, pg: PgConnection) -> int:
    """The records of the last window back into Redis, a page at a time; how many."""
    settings, keys = state.settings, state.keys
    ms, now = slice_ms(settings), now_ms()
    restored = 0
    async for page in pages(pg, RECORD_PAGES, settings.prefix,
                            (now - settings.dedupe_window_ms,)):
        commands: list[list[Any]] = []
        for row in page:
            field, partition, value = bytes(row[0]), int(row[1]), bytes(row[2])  # type: ignore[call-overload]
            # A record made on a clock ahead of this Redis's (another host, a clock set back)
            # goes to the current slice: a retry looks in its own and the ones before, and
            # found none in a slice ahead: applied again (test_records_clock_behind.py).
            slice_ = min(int(row[3]) // ms, now // ms)  # type: ignore[call-overload]
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
        # Every reply checked (an error raised, the restore not gone on past it): a record not
        # written back (OOM, a key of another type) would let a retry of its call run again.
        if commands:
            await checked_pipeline(state.conn, commands, "restore")
    return restored
