"""Set-aside triggers: their marks, and the catch-up that hands their events on alone.

A trigger whose target stream is full (the backlog) is set aside from the event it stopped
at (reactive/batch.py): its mark, the position just before that event, is written to the
partition's `aside` hash (trigger id -> "<id> <n>", lua/aside.lua, only while the lease
holds) before the partition's position may move past the event, and the main pass skips the
trigger while it has one. Nothing is dropped for it, and the partition's other triggers go
on (docs/decisions/0067).

The catch-up (`CatchUp.run`, at most every CHECK_S per partition, by the task that runs the
partition's batches, so the two passes never overlap): for each marked trigger, its target's
room is checked as the main pass checks it (`Batches.room_for`: an XLEN at most once a pass,
none while the room counted is fresh); with room, the partition's events after its mark
(XRANGE, at most BATCH) are matched for it alone through the main pass's own code (filters,
grants, start revision, conditions and barriers: `Batches.handler_call`) and its calls go
out with its mark's move (`Batches.hand_on` with `mark_of`), stopping again when the target
is full. A mark that reaches the partition's position is dropped: the trigger rejoins the
main pass from there, so its deliveries keep the stream's order. A mark of a trigger that is
no longer registered is dropped. Events the hard cap cut after a mark are counted for its
trigger and passed (reactive/trimming.py `cut_marks`: the catch-up reads the stream's
front with its events, so an ordinal is never counted from a gap).
"""

from __future__ import annotations

import logging
from typing import Any

from stateworker.reactive import trimming
from stateworker.reactive.batch import Batches, Outcome
from stateworker.reactive.trimming import Position, StreamInfo
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ReplyError

log = logging.getLogger("stateworker.reactive.aside")

BATCH = 512  # events read for one set-aside trigger per pass (as the main pass reads)
# A partition's set-aside triggers are looked at this often (their targets' room, at most one
# XLEN each): a drained target's trigger catches up within it.
CHECK_S = 0.2


async def load(state: RedisState, partition: int) -> dict[str, Position]:
    """The partition's marks as Redis holds them (a partition taken, or its position reread)."""
    flat = await state.conn.execute("HGETALL", state.keys.partition(partition).aside)
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return {field.decode(): trimming.parse_mark(value) for field, value in pairs}


class CatchUp:
    """Hands on the set-aside triggers of one dispatcher's partitions (`marks`, shared with its
    `Batches`)."""

    def __init__(self, state: RedisState, batches: Batches) -> None:
        self.state = state
        self.batches = batches
        self.marks = batches.marks
        self._waited = False  # (whether the pass running found a target full)

    async def run(self, partition: int) -> Outcome:
        """One pass over the partition's marks, in trigger id order."""
        at = self.batches.positions.get(partition)
        marks = self.marks.get(partition)
        if at is None or not marks:
            return Outcome.GONE if at is None else Outcome.DONE
        read: set[str] = set()  # (the target streams whose length this pass read)
        # Every marked trigger's room at once: one XLEN round trip a pass, whatever their count.
        matchers = self.batches.triggers().matchers
        full = await self.batches.room_for(
            partition, [matchers[t] for t in marks if t in matchers], read)
        self._waited = bool(full)
        for trigger_id in sorted(marks):
            if trigger_id in full and trigger_id in matchers:
                continue  # (still full: noted as waiting)
            outcome = await self._one(partition, trigger_id, at, read)
            if outcome is not Outcome.DONE:
                return outcome
        if self._waited:  # (a target found full again: one wait counted a pass)
            self.batches.counts.add("backlog_waits")
        if not marks:
            self.marks.pop(partition, None)
        return Outcome.DONE

    async def _one(self, partition: int, trigger_id: str, at: Position,
                   read: set[str]) -> Outcome:
        batches, mark = self.batches, self.marks[partition][trigger_id]
        matcher = batches.triggers().matchers.get(trigger_id)
        if matcher is None or mark.n >= at.n:  # (unregistered, or caught up: dropped)
            return await batches.hand_on(partition, [], at, at, mark_of=trigger_id)
        keys = self.state.keys.partition(partition)
        # The events after the mark, then the stream's front: a cut after the read began is
        # seen (its ordinals would be wrong), and the pass leaves it to the cut's count.
        entries, info = await pipeline(self.state.conn, self.state.library, [
            ["XRANGE", keys.events, f"({mark.id}", at.id, "COUNT", BATCH],
            ["XINFO", "STREAM", keys.events]])
        if isinstance(entries, ReplyError):  # (the pass is tried again from the mark)
            raise entries
        if StreamInfo(info).deleted > mark.n:
            await trimming.cut_marks(self.state, partition, {trigger_id: mark},
                                     StreamInfo(info), batches.leases.token, self.marks)
            return Outcome.DONE
        calls: list[list[Any]] = []
        moved = mark
        try:
            for index, (entry_id, flat) in enumerate(entries):
                event = batches.event_of(partition, entry_id, flat)
                if event is not None and any(
                        m.trigger.id == trigger_id
                        for m in batches.triggers().matching(event, batches.granted, partition)):
                    if await batches.room_for(partition, [matcher], read):
                        self._waited = True  # (full again: the mark stops before it)
                        break
                    call = await batches.handler_call(matcher, event, partition)
                    if call is not None:
                        calls.append(call)
                        batches.count_call(matcher.trigger, partition)
                moved = Position(entry_id.decode(), mark.n + index + 1)
            else:
                if len(entries) < BATCH:  # (read up to the partition's position)
                    moved = at
            if not calls and moved == mark:  # (full at its first event: nothing moved)
                return Outcome.DONE
            sending, calls = calls, []
            return await batches.hand_on(partition, sending, moved, at, mark_of=trigger_id)
        finally:
            batches.sent(calls)  # (gathered, never handed on: the pass failed)
