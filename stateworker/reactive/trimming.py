"""Dispatch positions and the trimming of the partition event streams.

The rule: a partition's stream is trimmed (`XTRIM MINID ~`) only below ALL of what its
dispatcher has handed on, what the snapshot has committed to PostgreSQL (its `snapshotted`
position, when the partition has one: a snapshot that lags holds trimming back) and the
retention window for watches (`events_retain` seconds);
the holder of the partition's lease trims it, once a round. The entry scripts keep their
`MAXLEN ~ events_maxlen` as a hard cap that protects memory (writes pay nothing more for
the rule); when the cap cuts events the dispatcher had not handed on, `trim` sees it (more
entries were removed from the stream's front than the position's ordinal), logs an error,
counts the events lost in `<partition>:cut` (shown by `status`) and moves past them. The
bytes are bounded too (`events_max_bytes`): over it, what is handed on and snapshotted goes
before the retention window ends, oldest first (reactive/event_bytes.py).

A set-aside trigger's mark (reactive/aside.py) holds trimming back as the position does: the
stream is kept from the oldest of them. Events the cap cut after a mark are logged, counted
for its trigger (`<id>|cut` in the dispatch's per-trigger hash, `status`) and passed
(`cut_marks`), as the position's are.

A position is `(id, n)`: the last event id handed on and its ordinal in the stream (how many
entries were ever added up to it), so `entries-added - n` is the exact dispatch lag.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.events.model import MAX_SEQ, revision_of
from stateworker.reactive.event_bytes import Ledger, bytes_cut, measure_commands, measure_replies
from stateworker.scripts.upkeep_bindings import ADVANCE, ASIDE, advance_call, aside_call
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ReplyError

log = logging.getLogger("stateworker.reactive.trimming")


class Position(msgspec.Struct):
    """A partition's dispatch position: the last id handed on and its ordinal."""

    id: str
    n: int


def parse_mark(value: bytes) -> Position:
    """A set-aside trigger's mark as aside.lua stores it: "<id> <n>"."""
    at, _, n = value.decode().partition(" ")
    return Position(at, int(n))


class StreamInfo:
    """What XINFO STREAM says of a partition's stream (zeros when it does not exist)."""

    def __init__(self, reply: Any) -> None:
        fields = {} if isinstance(reply, ReplyError) else dict(zip(reply[::2], reply[1::2],
                                                                  strict=True))
        self.length = int(fields.get(b"length", 0))
        self.added = int(fields.get(b"entries-added", 0))
        # (Trimming does not move `max-deleted-entry-id`, only XDEL does: the first entry
        # kept and the count of entries removed from the front are what trimming changes.)
        self.first_id = (fields.get(b"recorded-first-entry-id") or b"0-0").decode()
        last = fields.get(b"last-generated-id") or b"0-0"
        self.last_id = last.decode()

    @property
    def deleted(self) -> int:
        """Entries removed from the front (by trimming) so far: the ordinal of the last."""
        return self.added - self.length


async def infos(state: RedisState, partitions: list[int]) -> list[StreamInfo]:
    commands = [["XINFO", "STREAM", state.keys.partition(p).events] for p in partitions]
    replies = await pipeline(state.conn, state.library, commands) if commands else []
    return [StreamInfo(reply) for reply in replies]


async def snapshot_positions(state: RedisState, partitions: list[int]) -> dict[int, tuple[int, int]]:
    """The snapshot's acknowledged positions of the partitions that have one."""
    commands = [["HGET", state.keys.partition(p).snapshotted, "id"] for p in partitions]
    replies = await state.conn.pipeline(commands) if commands else []
    return {p: revision_of(reply) for p, reply in zip(partitions, replies, strict=True) if reply}


async def position(state: RedisState, partition: int, token: str) -> Position:
    """The stored position, or (first dispatch of this stream) just before its first kept
    event: every event still in the stream is handed on. The first position is stored at
    once, so events the cap cuts from now on are seen as cut."""
    keys = state.keys.partition(partition)
    stored = await state.conn.execute("HMGET", keys.dispatched, "id", "n")
    if stored[0] is not None:
        return Position(stored[0].decode(), int(stored[1]))
    (info,) = await infos(state, [partition])
    first = Position("0-0", info.deleted)
    await pipeline(state.conn, state.library, [ADVANCE.command(
        state.library, *advance_call(keys.lease, keys.dispatched, token, first.id, first.n))])
    return first


def _mark_cuts(state: RedisState, partition: int, marks: Mapping[str, Position],
               info: StreamInfo, token: str) -> tuple[list[list[Any]], dict[str, Position]]:
    """The commands that count, for their triggers, the events the cap cut after their
    marks and move the marks past them (lease-guarded); the marks moved."""
    commands: list[list[Any]] = []
    moved: dict[str, Position] = {}
    part = state.keys.partition(partition)
    for trigger_id, mark in sorted(marks.items()):
        if info.deleted <= mark.n:
            continue
        lost = info.deleted - mark.n
        log.error("partition %d: the event stream's cap (events_maxlen %d) cut %d events "
                  "before they were handed on to set-aside trigger %s (the first kept is %s)",
                  partition, state.settings.events_maxlen, lost, trigger_id, info.first_id,
                  extra={"event": "dispatch.events_cut", "partition": partition, "lost": lost,
                         "trigger": trigger_id, "first_kept": info.first_id})
        moved[trigger_id] = Position(mark.id, info.deleted)
        commands += [["HINCRBY", state.keys.dispatch_by_trigger, f"{trigger_id}|cut", lost],
                     ASIDE.command(state.library, *aside_call(
                         part, token, trigger_id, (mark.id, info.deleted)))]
    return commands, moved


async def cut_marks(state: RedisState, partition: int, marks: Mapping[str, Position],
                    info: StreamInfo, token: str, held: dict[int, dict[str, Position]]) -> None:
    """`_mark_cuts` run now (the catch-up found a cut); `held`: the marks in memory."""
    commands, moved = _mark_cuts(state, partition, marks, info, token)
    if commands:
        await pipeline(state.conn, state.library, commands)
        held.setdefault(partition, {}).update(moved)


async def trim(state: RedisState, positions: Mapping[int, Position], token: str,
               ledgers: dict[int, Ledger] | None = None,
               marks: dict[int, dict[str, Position]] | None = None) -> dict[int, Position]:
    """Trim every held partition by the rule; the positions moved past events the hard cap
    cut before they were handed on. `ledgers`: the held streams' byte ledgers, kept from
    round to round by the caller (one made for a partition that has none). `marks`: the
    set-aside triggers' marks, held as positions are (those the cap passed moved here)."""
    held = sorted(positions)
    ledgers = {} if ledgers is None else ledgers
    marks = {} if marks is None else marks
    moved: dict[int, Position] = {}
    marks_moved: dict[int, dict[str, Position]] = {}
    commands: list[list[Any]] = []
    keep_from = (now_ms() - int(state.settings.events_retain * 1000), 0)
    snapshotted = await snapshot_positions(state, held)

    def owed(p: int) -> tuple[int, int]:  # the oldest of its position and marks
        return min(revision_of(x.id) for x in (positions[p], *marks.get(p, {}).values()))

    # The oldest event each partition still owes (to triggers, to the snapshot): a stream
    # with nothing kept before it has nothing to trim for bytes, and is not measured.
    fences = {p: min(owed(p), snapshotted.get(p, (MAX_SEQ, MAX_SEQ))) for p in held}
    sized = [ledgers.setdefault(p, Ledger()).trimmable(fences[p]) for p in held]
    sent: list[list[Any]] = []
    for partition, measured in zip(held, sized, strict=True):
        sent += measure_commands(state.keys.partition(partition).events, measured)
    replies = await pipeline(state.conn, state.library, sent) if sent else []
    offset = 0
    for partition, measured in zip(held, sized, strict=True):
        count = len(measure_commands("", measured))
        reply, size = measure_replies(replies[offset:offset + count], measured)
        offset += count
        info = StreamInfo(reply)
        keys = state.keys.partition(partition)
        current = positions[partition]
        if info.deleted > current.n:  # (our own trimming never passes the position)
            lost = info.deleted - current.n
            log.error("partition %d: the event stream's cap (events_maxlen %d) cut %d events "
                      "before they were dispatched (the first kept is %s); their triggers "
                      "did not fire", partition, state.settings.events_maxlen, lost,
                      info.first_id, extra={"event": "dispatch.events_cut",
                                            "partition": partition, "lost": lost,
                                            "first_kept": info.first_id})
            current = moved[partition] = Position(current.id, info.deleted)
            commands += [["HINCRBY", keys.cut, "events", lost],
                         ["HSET", keys.cut, "first_kept", info.first_id, "at_ms", now_ms()],
                         ADVANCE.command(state.library, *advance_call(
                             keys.lease, keys.dispatched, token, current.id, current.n))]
        cuts, marks_moved[partition] = _mark_cuts(state, partition, marks.get(partition, {}),
                                                  info, token)
        commands += cuts
        below = min(revision_of(current.id), owed(partition), keep_from,
                    snapshotted.get(partition, keep_from))
        over = bytes_cut(ledgers[partition], partition, info, size,
                         state.settings.events_max_bytes, fences[partition])
        if over is not None:  # (exact: the chunks the ledger dropped go whole)
            at = max(over, below)
            commands.append(["XTRIM", keys.events, "MINID", f"{at[0]}-{at[1]}"])
        elif below > (0, 0) and info.length:
            commands.append(["XTRIM", keys.events, "MINID", "~", f"{below[0]}-{below[1]}"])
    if commands:
        await pipeline(state.conn, state.library, commands)
    for partition, passed in marks_moved.items():
        if passed:
            marks.setdefault(partition, {}).update(passed)
    return moved
