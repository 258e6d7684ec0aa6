"""The kept replies of writes that run no entry script -> PostgreSQL (`sw_calls`), once it
holds every write they answer (decision 0061).

Delete-by-topic, the barriers, the indexes, the triggers and the namespaces run in steps and
keep their reply after the last one (state/core/once.py). With the snapshot on, the keep also
appends the record to the `unsaved_kept` stream of the call id's home partition, with what
PostgreSQL must hold first (`once.Needs`): the position its commits must have reached in each
stream the steps wrote (a partition's events, the registry), and the barriers whose change must
be stored (their mark gone from the partition's changed set, and the partition's barriers
followed: one written before a snapshot followed them was never marked, barriers.py).

Once a round the holder of each partition reads that stream and commits, in one transaction of
their own, the records whose needs the snapshot meets: each position read from its mirror in
Redis (a partition's `snapshotted`, the registry's `registry_snapshotted`, written only after
the commit they mirror), each mark still absent. The others wait for a later round. So a record
never reaches PostgreSQL before the writes it answers, and a restore, which brings back what
PostgreSQL holds, brings back its record only with them; a call whose writes PostgreSQL holds
in part has no record there: its retry after a restore runs it again. A record older than the
dedupe window is dropped unstored (no retry can need it).

The positions come from the same Redis as the records: the partition's marker is read before
and after (Fenced when it changed), and each commit passes the generation fence. A mirror that
a wipe or an older copy lost reads lower (or none): the record waits, never the other way. A
mark that a wipe lost reads as absent, which would be the other way: so each mirror and each
changed set counts only while its own partition's marker (the registry's, for its mirror),
read after it, is the generation; on a Redis Cluster a node that came back empty holds the
written partition while the id's home, elsewhere, is whole.

The other way is the cost: the writes reach PostgreSQL before their record (the keep follows
the last step, the record the commits). A wipe in between loses the record as a crash between
the last step and the keep does: the retry runs again, as the entry scripts' records avoid by
riding with their change (decision 0036), which a write of several steps and streams cannot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.events.model import Revision, revision_of
from stateworker.keys import KeySpace
from stateworker.scripts.upkeep_bindings import SNAPPAGE, snappage_call
from stateworker.snapshot.barriers import FOLLOWED, FOLLOWED_FIELD
from stateworker.snapshot.rows import confirm
from stateworker.snapshot.tables import CallRow, PgConnection, apply_records
from stateworker.state.core.once import Needs
from stateworker.state.core.store import RedisState
from stateworker.state.generation import PARTITION_FIELD
from stateworker.transport.plans import pipeline

BATCH = 1000  # records read per trip, at most
# ... and bytes of them, about (snappage.lua): a kept reply may be large (a barrier's payload,
# up to 2 MiB), each trip one PostgreSQL transaction of its own. As a batch (rows.BATCH_BYTES).
BATCH_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Kept:
    """One record of the stream, as read."""

    entry_id: bytes
    row: CallRow
    needs: Needs


def _read(entry_id: bytes, flat: list[bytes]) -> Kept:
    fields = dict(zip(flat[::2], flat[1::2], strict=True))
    row = CallRow(fields[b"f"], fields[b"v"], revision_of(entry_id), int(fields[b"t"]))
    return Kept(entry_id, row, msgspec.msgpack.decode(fields[b"n"], type=Needs))


async def store_covered(state: RedisState, pg: PgConnection, prefix: str, partition: int,
                        generation: str) -> int:
    """Commit the partition's kept records whose writes PostgreSQL holds, read from a Redis
    of `generation` (Fenced when it is not); forget those and the expired ones. How many were
    committed."""
    keys = state.keys.partition(partition)
    marker: list[Any] = ["HGET", keys.history, PARTITION_FIELD]
    oldest = now_ms() - state.settings.dedupe_window_ms
    stored, start = 0, "-"
    while True:
        reply, held = await pipeline(state.conn, state.library, [SNAPPAGE.command(
            state.library, *snappage_call(keys.unsaved_kept, start, BATCH, BATCH_BYTES)),
            marker])
        confirm(keys, held, generation)
        page = SNAPPAGE.read(reply)
        records = [_read(entry_id, flat) for entry_id, flat in page.entries]
        if not records:
            return stored
        # (read after the records: a position mirrored since only covers more; each name's
        # marker after it: a partition lost alone, its node back empty, has no mark either)
        mirrors = sorted({name for r in records for name, _ in r.needs.positions})
        marks = sorted({pair for r in records for pair in r.needs.unmarked})
        vouching = _vouching(state.keys, [*mirrors, *(changed for changed, _ in marks)])
        markers = sorted({tuple(command) for command in vouching.values()})
        histories = _histories(state.keys)  # (a name of none is not `whole`: marked)
        sets = sorted({changed for changed, _ in marks if changed in histories})
        *replies, after = await state.conn.pipeline([
            *(["HGET", name, "id"] for name in mirrors),
            *(["SISMEMBER", changed, name] for changed, name in marks),
            *(["HGET", histories[changed], FOLLOWED_FIELD] for changed in sets),
            *(list(command) for command in markers), marker])
        confirm(keys, after, generation)
        read, replies = replies[:len(mirrors)], replies[len(mirrors):]
        marks_read, replies = replies[:len(marks)], replies[len(marks):]
        # (a barrier written before a snapshot followed its partition was never marked: its
        # mark counts as there until the rescan copied it, barriers.py)
        unfollowed = {changed for changed, reply in zip(sets, replies[:len(sets)], strict=True)
                      if reply != FOLLOWED.encode()}
        vouched = {command: reply is not None and reply.decode() == generation for command, reply
                   in zip(markers, replies[len(sets):], strict=True)}
        whole = {name for name, command in vouching.items() if vouched[tuple(command)]}
        at: dict[str, Revision | None] = {
            name: None if reply is None or name not in whole else revision_of(reply)
            for name, reply in zip(mirrors, read, strict=True)}
        marked = {pair: bool(reply) or pair[0] not in whole or pair[0] in unfollowed
                  for pair, reply in zip(marks, marks_read, strict=True)}
        rows: list[CallRow] = []
        done: list[bytes] = []
        for record in records:
            if record.row.at_ms < oldest:
                done.append(record.entry_id)
            elif _covered(record.needs, at, marked):
                rows.append(record.row)
                done.append(record.entry_id)
        if rows:
            await apply_records(pg, prefix, partition, rows, generation)
            stored += len(rows)
        if done:
            await state.conn.execute("XDEL", keys.unsaved_kept, *done)
        if not page.more:
            return stored
        start = "(" + records[-1].entry_id.decode()


def _vouching(space: KeySpace, names: list[str]) -> dict[str, list[Any]]:
    """The generation marker that vouches for each name a record's needs read: its
    partition's (a `snapshotted`, a `barriers_changed`), the registry's (its mirror). A
    name of none (a version's unknown to this one) is left out: it vouches for nothing."""
    markers: dict[str, list[Any]] = {space.registry_snapshotted: ["GET", space.registry_marker]}
    for part in space.all_partitions():
        markers[part.snapshotted] = markers[part.barriers_changed] = \
            ["HGET", part.history, PARTITION_FIELD]
    return {name: markers[name] for name in names if name in markers}


def _histories(space: KeySpace) -> dict[str, str]:
    """Each partition's changed set -> its history hash (where `FOLLOWED_FIELD` is)."""
    return {part.barriers_changed: part.history for part in space.all_partitions()}


def _covered(needs: Needs, at: dict[str, Revision | None],
             marked: dict[tuple[str, str], bool]) -> bool:
    """Whether PostgreSQL holds every write `needs` names: each position at or past its
    revision, no barrier left marked."""
    for name, revision in needs.positions:
        position = at.get(name)
        if position is None or position < revision_of(revision):
            return False
    return not any(marked.get((changed, name), True) for changed, name in needs.unmarked)
