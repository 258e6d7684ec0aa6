"""A Redis behind the snapshot: an older copy of its data (a restart from an older AOF, a
replica promoted before it synced) holds the same generation markers as the Redis whose
history PostgreSQL applied, so the markers cannot tell it (decision 0037). What it lacks
shows in its streams: a partition's event stream has had fewer events added than PostgreSQL
applied, ends before the position applied, or keeps no event at that position although it
keeps that far back (an older copy that took new writes since catches up on the count, not on
the ids): `stream_behind`.

It is checked once a round for the partitions held (`behind_partitions`, which the
snapshotter answers by refusing writes there), by the repair at start, and again with each
batch's read (snapshot/steps.py `_apply`): the lean connection reconnects without a word, so
Redis may have restarted on an older copy between the round's check and a read.
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


async def behind_partitions(state: RedisState, positions: Mapping[int, StoredPosition],
                            held: list[int], infos: list[StreamInfo]) -> dict[int, str]:
    """The partitions of `held` (with their streams' `infos`) that are behind what PostgreSQL
    holds, and why: their streams against the `positions` it applied."""
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
    replies = await state.conn.pipeline([
        ["XRANGE", state.keys.partition(p).events, positions[p].id, positions[p].id]
        for p in check])
    for p, reply in zip(check, replies, strict=True):
        reason = stream_behind(p, positions[p], infos[held.index(p)], bool(reply))
        if reason is not None:
            found[p] = reason
    return found
