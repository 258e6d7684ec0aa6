"""A Redis behind the snapshot: an older copy of its data (a restart from an older AOF, a
replica promoted before it synced) holds the same generation markers as the Redis whose
history PostgreSQL applied, so the markers cannot tell it (decision 0037). What it lacks
shows in counters that only grow:

  - a partition's event stream has had fewer events added than PostgreSQL applied, ends
    before the position applied, or keeps no event at that position although it keeps that
    far back (an older copy that took new writes since catches up on the count, not on the
    ids): `stream_behind`;
  - its barrier write counter (`barrier_writes`: every barrier write takes the next `w`) is
    below the highest `w` PostgreSQL holds of its barriers: barriers write no events, so a
    partition whose entries did not change since the copy looks current by its stream alone
    (`barriers_behind`; a barrier stored is checked against its row too: barriers.py).

  - its snapshot read counter (`snapshot_reads`) is below the count PostgreSQL holds of it:
    every read the snapshot commits ends with `lua/snapread.lua`, which counts it (only while
    the counter is not below PostgreSQL's), and the count is committed with the data. A copy
    made before a read has a lower count, and only the snapshot counts, so writes on the copy
    since (barrier arrivals past the newer `w`, entries past the count) never hide it
    (`reads_behind`; each read checks it in its pipeline: `counted`, against the count held
    in memory, and each commit against PostgreSQL's: tables.commit_count). The registry has a
    counter of its own (`KeySpace.registry_reads`, PostgreSQL's count under partition
    `REGISTRY`), counted by each copy of it: the registry stream's entries-added, all its
    copy checked before, catches up with registrations made on the copy (`registry_behind`).

They are checked once a round for the partitions held (`behind_partitions`, which the
snapshotter answers by refusing writes there), by the repair at start, and again with each
read it commits (snapshot/steps.py `_apply`, barriers.py `store_changed`): the lean connection
reconnects without a word, so Redis may have restarted on an older copy since the round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stateworker.errors import Unavailable
from stateworker.events.model import revision_of
from stateworker.reactive.trimming import StreamInfo
from stateworker.scripts.upkeep_bindings import SNAPREAD, snapread_call
from stateworker.snapshot.generation import Fenced
from stateworker.snapshot.tables import REGISTRY, StoredPosition
from stateworker.state.core.store import RedisState

WHY = ("Redis is behind the snapshot: an older copy of its data, or a replica promoted "
       "before it synced")


def stream_behind(partition: int, position: StoredPosition, info: StreamInfo,
                  holds_position: bool | None) -> str | None:
    """Why the partition's stream is not the history PostgreSQL applied up to `position`;
    None when nothing says so. `holds_position`: whether the stream holds the event at
    `position` (None: not read; `needs_read` says whether that matters)."""
    if position.id == "0-0":  # (nothing applied: nothing to be behind)
        return None
    if info.added < position.n:
        return (f"partition {partition}'s event stream has had {info.added} events added, "
                f"PostgreSQL applied {position.n}")
    if revision_of(info.last_id) < revision_of(position.id):
        return (f"partition {partition}'s event stream ends at {info.last_id}, before "
                f"{position.id} that PostgreSQL applied")
    if holds_position is False and needs_read(position, info):
        return (f"partition {partition}'s event stream holds no event {position.id} that "
                "PostgreSQL applied (other events since)")
    return None


def needs_read(position: StoredPosition, info: StreamInfo) -> bool:
    """Whether the stream keeps events as far back as `position` (then it must hold it)."""
    return bool(info.length) and revision_of(info.first_id) <= revision_of(position.id)


def barriers_behind(partition: int, counter: int, stored_w: int) -> str | None:
    """Why the partition's barriers are older than PostgreSQL's: its write counter in Redis
    (`counter`, 0 when absent) below the highest `w` PostgreSQL holds of them (`stored_w`)."""
    if counter >= stored_w:
        return None
    return (f"partition {partition}'s barrier write counter is at {counter}, PostgreSQL holds "
            f"a barrier written at {stored_w}")


def reads_behind(partition: int, counter: int, stored: int) -> str | None:
    """Why the partition is a copy older than a read PostgreSQL committed: its snapshot read
    counter in Redis (`counter`, 0 when absent) below the count PostgreSQL holds (`stored`)."""
    return _counted_below(f"partition {partition}'s", "a read", counter, stored)


def registry_behind(counter: int, stored: int) -> str | None:
    """`reads_behind` of the registry: its counter counts the copies PostgreSQL committed."""
    return _counted_below("the registry's", "a copy", counter, stored)


def _counted_below(whose: str, what: str, counter: int, stored: int) -> str | None:
    if counter >= stored:
        return None
    return (f"{whose} snapshot read counter is at {counter}, PostgreSQL holds {what} counted "
            f"at {stored}")


async def registry_reads_behind(state: RedisState, reads: Mapping[int, int]) -> str | None:
    """`registry_behind` for the counter in Redis now (the repair at start)."""
    stored = reads.get(REGISTRY, 0)
    if not stored:
        return None
    return registry_behind(int(await state.conn.execute("GET", state.keys.registry_reads)
                               or 0), stored)


def count_command(state: RedisState, counter: str, stored: int) -> list[Any]:
    """The command that ends a read the snapshot commits (lua/snapread.lua): it counts the
    read on `counter` (a partition's `snapshot_reads`, or the registry's) unless it is below
    `stored`, PostgreSQL's count."""
    return SNAPREAD.command(state.library, *snapread_call(counter, stored))


async def settle(state: RedisState) -> None:
    """`strict`: wait, as a strict batch does (state/core/confirm.py), until the read's count
    is fsynced and on the replicas strict asks for, before PostgreSQL commits it; Unavailable
    when it is not (nothing committed, the snapshot retries). A count PostgreSQL held that a
    promoted replica lacked made that replica, which held every acknowledged write and every
    row read, an "older copy". (The count follows the data in the replication stream: the
    replica then holds what was read too.)"""
    if state.confirm.needed:
        missing = await state.confirm.missing(state.conn)
        if missing is not None:
            raise Unavailable(f"the snapshot's read count is not confirmed: {missing}")


def counted(partition: int, reply: Any, stored: int) -> int:
    """The read's count from `count_command`'s reply; Fenced when the counter was below
    `stored` (a copy older than a read PostgreSQL committed: nothing of the read may be)."""
    number = SNAPREAD.read(reply).number
    if number <= 0:
        raise Fenced(f"{reads_behind(partition, -number, stored)} ({WHY})")
    return number


async def behind_partitions(state: RedisState, positions: Mapping[int, StoredPosition],
                            held: list[int], infos: list[StreamInfo],
                            barrier_w: Mapping[int, int],
                            reads: Mapping[int, int]) -> dict[int, str]:
    """The partitions of `held` (with their streams' `infos`) that are behind what PostgreSQL
    holds, and why: their streams against the `positions` it applied, their barrier write
    counters against the highest `w` it holds of their barriers (`barrier_w`), their snapshot
    read counters against the counts it holds (`reads`)."""
    found: dict[int, str] = {}
    check: list[int] = []
    for p, info in zip(held, infos, strict=True):
        position = positions.get(p)
        if position is None:
            continue
        reason = stream_behind(p, position, info, None)
        if reason is not None:
            found[p] = reason
        elif position.id != "0-0" and needs_read(position, info):
            check.append(p)
    written = [p for p in held if barrier_w.get(p, 0) > 0 and p not in found]
    read = [p for p in held if reads.get(p, 0) > 0 and p not in found]
    replies = await state.conn.pipeline([
        *(["XRANGE", state.keys.partition(p).events, positions[p].id, positions[p].id]
          for p in check),
        *(["GET", state.keys.partition(p).barrier_writes] for p in written),
        *(["GET", state.keys.partition(p).snapshot_reads] for p in read)])
    for p, reply in zip(check, replies[:len(check)], strict=True):
        reason = stream_behind(p, positions[p], infos[held.index(p)], bool(reply))
        if reason is not None:
            found[p] = reason
    counters = replies[len(check):]
    for p, reply in zip(written, counters[:len(written)], strict=True):
        reason = barriers_behind(p, int(reply or 0), barrier_w[p])
        if reason is not None and p not in found:
            found[p] = reason
    for p, reply in zip(read, counters[len(written):], strict=True):
        reason = reads_behind(p, int(reply or 0), reads[p])
        if reason is not None and p not in found:
            found[p] = reason
    return found
