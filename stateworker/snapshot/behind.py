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

They are checked once a round for the partitions held (`behind_partitions`, which the
snapshotter answers by refusing writes there), by the repair at start, and again with each
read it commits (snapshot/steps.py `_apply`, barriers.py `store_changed`): the lean connection
reconnects without a word, so Redis may have restarted on an older copy since the round.
"""

from __future__ import annotations

from collections.abc import Mapping

from stateworker.events.model import revision_of
from stateworker.reactive.trimming import StreamInfo
from stateworker.snapshot.tables import StoredPosition
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


async def behind_partitions(state: RedisState, positions: Mapping[int, StoredPosition],
                            held: list[int], infos: list[StreamInfo],
                            barrier_w: Mapping[int, int]) -> dict[int, str]:
    """The partitions of `held` (with their streams' `infos`) that are behind what PostgreSQL
    holds, and why: their streams against the `positions` it applied, their barrier write
    counters against the highest `w` it holds of their barriers (`barrier_w`)."""
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
    counted = [p for p in held if barrier_w.get(p, 0) > 0 and p not in found]
    replies = await state.conn.pipeline([
        *(["XRANGE", state.keys.partition(p).events, positions[p].id, positions[p].id]
          for p in check),
        *(["GET", state.keys.partition(p).barrier_writes] for p in counted)])
    for p, reply in zip(check, replies[:len(check)], strict=True):
        reason = stream_behind(p, positions[p], infos[held.index(p)], bool(reply))
        if reason is not None:
            found[p] = reason
    for p, reply in zip(counted, replies[len(check):], strict=True):
        reason = barriers_behind(p, int(reply or 0), barrier_w[p])
        if reason is not None and p not in found:
            found[p] = reason
    return found
