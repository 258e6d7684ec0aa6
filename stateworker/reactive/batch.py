"""One partition's batch of events -> handler calls, and the move of the partition's position.

For each event, in stream order: the triggers it reaches (reactive/matching.py: filters, match
rules, `acl` mode's grants, and the trigger's start: an event at or before the revision a
trigger started at is not its), their conditions (reactive/conditions.py), and one handler
call each (XADD to `<prefix>:bus:<service>`, id `<trigger id>:p<partition>:<revision>`,
fire-and-forget, `call_id_of`).

The calls go out in ONE pipeline, followed by the move of the position (`lua/advance.lua`,
only while the lease holds): at-least-once, since a crash before the move re-dispatches the
events with the same call ids. With the bus on a Redis of its own (STATEWORKER_BUS_REDIS_URL)
the calls' replies are awaited there and the move is kept in memory, stored by the dispatcher
within STORE_S with every other partition's (docs/decisions/0060). Before a
bus condition is asked, the calls gathered so far go out with the position moved to the last
event whose calls are all out: the events ahead of a pending condition are never held up by
it; only what follows it in its partition waits. A batch that hands nothing on moves the
position in memory only (stored at the next round).

The backlog (`trigger_backlog`, STATEWORKER_TRIGGER_BACKLOG): before an event's calls, each
target stream must hold fewer entries than that (its room counted down as calls are added,
its XLEN read again at most once a batch: when the last read is ROOM_S old or half the room
is used, `room_for`; a length read counts the calls gathered and not on the stream yet).
A trigger whose target is full is SET ASIDE from the event (docs/decisions/0067): what is
ahead of the event goes out, then the trigger's mark (the position just before the event,
`<partition>:aside`, lua/aside.lua while the lease holds) is written, before the batch goes
on, so no position past the event is ever stored before it. The event's calls for the other
triggers go out and the batch goes on; the main pass skips a trigger while it has a mark,
and reactive/aside.py catches it up from there, alone, once its target has room. One
trigger's dead target so never holds up the partition's other triggers. The trigger shows
it waits (`waiting_on` in `status`, the metric stateworker_trigger_waiting). A dead
target's stream holds at most the backlog plus one event's calls (with several replicas
handing on to it, plus what the others added since its length was last read: 0.1 s of
their calls, below half the backlog), the writes never wait for it (their events wait in
the partition's stream, which its cap bounds, and a mark holds trimming back as a position
does), and nothing is dropped: deliveries go on once its workers drain it.

A mark's moves go through `hand_on` too (`mark_of`): the trigger's calls, then its mark
moved (dropped once it reaches the partition's position), in one pipeline on one Redis.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from opentelemetry.trace import Span

from stateworker import tracing
from stateworker.bus.protocol import call_entry
from stateworker.errors import Unavailable
from stateworker.events.model import Event, decode_event, document_json, fields_of
from stateworker.keys import bus_shard_stream
from stateworker.reactive.conditions import Conditions
from stateworker.reactive.leases import Leases
from stateworker.reactive.matching import Matcher, TriggerSet
from stateworker.reactive.status import Counts
from stateworker.reactive.trimming import Position
from stateworker.schemas import Trigger
from stateworker.scripts.upkeep_bindings import ADVANCE, ASIDE, advance_call, aside_call
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import pipeline, redis_error
from stateworker.transport.retry import refused_for_now
from stateworker.transport.wire import ReplyError

log = logging.getLogger("stateworker.reactive.dispatcher")

# A target stream's length read this recently, with more than half the backlog free, is not
# read again: its room is counted down by the calls handed on (`Batches.room_for`).
ROOM_S = 0.1


def call_id_of(trigger_id: str, partition: int, revision: str) -> str:
    """A handler call's id: one per trigger and event. A revision (stream id) is unique
    within its partition only (two partitions can write the same id in the same
    millisecond), so the id names the partition too."""
    return f"{trigger_id}:p{partition}:{revision}"


class Outcome(enum.Enum):
    """How a batch ended: every event passed, the lease lost, or the partition no longer the
    batch's to move (a batch in a task of its own: a round gave it up, found its lease gone,
    or moved it meanwhile; the position is the round's)."""

    DONE = "done"
    LOST = "lost"
    GONE = "gone"


class Batches:
    """Dispatches the batches of one dispatcher's partitions. `positions` and `stored` are the
    dispatcher's (where dispatch is; what Redis holds), moved here as calls go out; `marks`
    its set-aside triggers' marks by partition (as Redis holds them: each written at once)."""

    def __init__(self, state: RedisState, leases: Leases, conditions: Conditions,
                 counts: Counts, triggers: Callable[[], TriggerSet],
                 hidden: Callable[[str], bool], granted: Callable[[Trigger, str], bool],
                 positions: dict[int, Position], stored: dict[int, Position],
                 marks: dict[int, dict[str, Position]]) -> None:
        self.state = state
        self.leases = leases
        self.conditions = conditions
        self.counts = counts
        self.triggers = triggers  # the current registrations (reloaded by the dispatcher)
        self.hidden = hidden
        self.granted = granted
        self.positions = positions
        self.stored = stored
        self.marks = marks
        # The delivery spans of traced events' calls not sent yet, by partition (its batches
        # may run in tasks of their own): each ends once its call is out (`hand_on`).
        self._sending: dict[int, list[Span]] = {}
        # The room of each target stream (the backlog less its length, counted down as calls
        # are handed on) and when its length was read (`room_for`).
        self._room: dict[str, int] = {}
        self._read_at: dict[str, float] = {}
        # Calls gathered for each target stream and not on it yet (every batch's, until its
        # hand-on ends): a length read meanwhile does not count them, the room must.
        self._unsent: dict[str, int] = {}

    async def run(self, partition: int, entries: list[Any]) -> Outcome:
        """Hand on one partition's batch (stream entries read after its position)."""
        start = at = self.positions[partition]  # `at`: the position this batch last set
        calls: list[list[Any]] = []
        read: set[str] = set()  # the streams whose length this batch read
        self._sending.pop(partition, None)  # (a failed batch's: never sent, never exported)
        try:
            for index, (entry_id, flat) in enumerate(entries):
                event = self.event_of(partition, entry_id, flat)
                if event is None:
                    continue
                matchers = self.triggers().matching(event, self.granted, partition)
                marked = self.marks.get(partition)
                if marked:  # (set aside: reactive/aside.py hands them on)
                    matchers = [m for m in matchers if m.trigger.id not in marked]
                before = Position(entries[index - 1][0].decode(), start.n + index) \
                    if index else start
                full = await self.room_for(partition, matchers, read) if matchers else set()
                if full:
                    sending, calls = calls, []
                    outcome = await self._set_aside(partition, full, sending, before, at)
                    if outcome is not Outcome.DONE:
                        return outcome
                    at = self.positions[partition]
                    matchers = [m for m in matchers if m.trigger.id not in full]
                for matcher in matchers:
                    if matcher.asks_the_bus and calls:  # (what is ahead goes out first)
                        sending, calls = calls, []
                        outcome = await self.hand_on(partition, sending, before, at)
                        if outcome is not Outcome.DONE:
                            return outcome
                        at = before
                    call = await self.handler_call(matcher, event, partition)
                    if call is not None:
                        calls.append(call)
                        self.count_call(matcher.trigger, partition)
            moved = Position(entries[-1][0].decode(), start.n + len(entries))
            if calls:
                sending, calls = calls, []
                return await self.hand_on(partition, sending, moved, at)
            if not self._ours(partition, at):
                return Outcome.GONE
            self.positions[partition] = moved  # nothing handed on: stored at the next round
            return Outcome.DONE
        finally:
            self.sent(calls)  # (gathered, never handed on: the batch failed)

    def _ours(self, partition: int, at: Position) -> bool:
        """Whether `partition` is still the batch's to move: held, and at the position the
        batch last set (positions are replaced, never changed: `is` tells a round's)."""
        return partition in self.leases.held and self.positions.get(partition) is at

    def count_call(self, trigger: Trigger, partition: int) -> None:
        """A call of `trigger` gathered: its target's room counted down, the call waiting."""
        target = self._target(trigger, partition)
        self._room[target] -= 1
        self._unsent[target] = self._unsent.get(target, 0) + 1
        self.counts.handed_on(trigger.id)

    def sent(self, calls: list[list[Any]]) -> None:
        """`calls` are no longer waiting to go out (on their streams now, or never)."""
        for call in calls:  # (an XADD: its stream second)
            self._unsent[call[1]] -= 1

    async def room_for(self, partition: int, matchers: list[Matcher], read: set[str]
                        ) -> set[str]:
        """The event's triggers whose target stream is not below the backlog (noted as
        waiting; empty: every one has room). A stream's length is read (XLEN, the
        streams of an event in one round trip) at most once a batch, and not at all while
        the room last read is fresh (ROOM_S) and more than half the backlog: the room is
        counted down by every call handed on, so it only errs low (a worker drained
        meanwhile), but for other replicas' calls, which a fresh read near the limit sees."""
        room, backlog = self._room, self.state.settings.trigger_backlog
        now = anyio.current_time()
        targets = {m.trigger.id: self._target(m.trigger, partition) for m in matchers}
        stale = sorted(t for t in set(targets.values()) - read
                       if t not in room or room[t] <= backlog // 2
                       or now - self._read_at[t] >= ROOM_S)
        if stale:
            lengths = await self.state.bus_conn.pipeline([["XLEN", t] for t in stale])
            for length in lengths:
                if isinstance(length, ReplyError):  # (NOPERM, WRONGTYPE: the batch retries)
                    raise length
            unsent = self._unsent  # (gathered by the batches running, not on the stream yet)
            room.update((t, backlog - int(n) - unsent.get(t, 0))
                        for t, n in zip(stale, lengths, strict=True))
            self._read_at.update((t, now) for t in stale)
            read.update(stale)
        full = {trigger: stream for trigger, stream in targets.items() if room[stream] <= 0}
        for trigger, stream in full.items():
            self.counts.waiting(trigger, stream, backlog - room[stream])
        return set(full)

    async def _set_aside(self, partition: int, full: set[str], calls: list[list[Any]],
                         before: Position, at: Position) -> Outcome:
        """The triggers `full` set aside from the event after `before`: what is ahead of it
        goes out first (a mark says its trigger's calls up to it are out), then their marks
        are written (lease-guarded) before the batch goes on past the event."""
        self.counts.add("backlog_waits")
        if calls:
            outcome = await self.hand_on(partition, calls, before, at)
            if outcome is not Outcome.DONE:
                return outcome
        elif self._ours(partition, at):
            self.positions[partition] = before  # (in memory: the marks are stored first)
        else:
            return Outcome.GONE
        keys = self.state.keys.partition(partition)
        replies = await pipeline(self.state.conn, self.state.library, [ASIDE.command(
            self.state.library, *aside_call(keys, self.leases.token, t, (before.id, before.n)))
            for t in sorted(full)])
        if not all(ASIDE.read(reply).done for reply in replies):
            return Outcome.LOST
        self.marks.setdefault(partition, {}).update((t, before) for t in full)
        log.warning("partition %d: triggers %s set aside at %s (their target is full)",
                    partition, ", ".join(sorted(full)), before.id,
                    extra={"event": "dispatch.set_aside", "partition": partition})
        return Outcome.DONE

    def _target(self, trigger: Trigger, partition: int) -> str:
        """The stream a trigger's calls for an event of `partition` go to: the shard of the
        event's partition, `partition_of(scope) % shards`, the rule every caller follows (the
        document's `scope`), so one scope's calls keep their order."""
        settings = self.state.settings
        return bus_shard_stream(settings.prefix, trigger.service,
                                partition % settings.bus_shards)

    def event_of(self, partition: int, entry_id: bytes, flat: list[Any]) -> Event | None:
        """The entry's event, when a trigger may want it (None: a hidden scope, no trigger
        of its scope, or not a change event, which is logged, counted and skipped)."""
        fields = fields_of(flat)
        scope = fields.get(b"scope", b"").decode(errors="replace")
        if self.hidden(scope) or not self.triggers().candidates(scope):
            return None
        try:
            return decode_event(entry_id, fields)
        except (KeyError, ValueError) as exc:  # not written by our scripts: skipped
            self.counts.add("malformed_events")
            log.error("partition %d: entry %s is not a change event (%s: %s); skipped",
                      partition, entry_id.decode(), type(exc).__name__, exc,
                      extra={"event": "dispatch.malformed", "partition": partition})
            return None

    async def hand_on(self, partition: int, calls: list[list[Any]], moved: Position,
                       at: Position, mark_of: str | None = None) -> Outcome:
        """The calls, then the position moved from `at` (one pipeline): DONE, LOST (the lease
        lost), GONE (`_ours`). With the bus on a Redis of its own the calls' replies are
        awaited and the move is left in memory: the dispatcher stores it with the others
        within STORE_S (`_persist`); there no script checks the lease, so the batch does,
        before the calls go and before the move (the round that finds a lease gone drops it
        from `held` and the position from `positions`). `mark_of`: a set-aside trigger's
        calls, and its mark moved instead (aside.lua, stored at once on a split bus too),
        dropped once it reaches the partition's position `at`."""
        try:  # (whatever happens, `calls` are no longer waiting to go out: `sent`)
            keys = self.state.keys.partition(partition)
            advance: list[Any] | None
            if mark_of is not None:
                mark = None if moved.n >= at.n else (moved.id, moved.n)
                advance = ASIDE.command(self.state.library, *aside_call(
                    keys, self.leases.token, mark_of, mark))
            else:
                advance = None if self.state.split_bus else ADVANCE.command(
                    self.state.library, *advance_call(keys.lease, keys.dispatched,
                                                      self.leases.token, moved.id, moved.n))
            if not self._ours(partition, at):
                return Outcome.GONE
            if advance is None:
                replies = await self._send_to_bus(calls)
            elif self.state.split_bus:  # (a mark: the calls out first, then the move)
                replies = await self._send_to_bus(calls) if calls else []
                if not self._ours(partition, at):
                    return Outcome.GONE
                replies += await pipeline(self.state.conn, self.state.library, [advance])
            else:
                replies = await self._send(partition, calls, advance)
        finally:
            self.sent(calls)
            for span in self._sending.pop(partition, ()):  # (their calls out, or failed)
                span.end()
        failed = [r for r in replies[:len(calls)] if isinstance(r, ReplyError)]
        if failed:
            self.counts.add("append_errors", len(failed))
            log.error("could not append %d handler calls: %s", len(failed), failed[0],
                      extra={"event": "dispatch.append_failed", "partition": partition})
        self.counts.add("handler_calls", len(calls) - len(failed))
        if mark_of is not None:
            if not ASIDE.read(replies[-1]).done:
                return Outcome.LOST
            marks = self.marks.setdefault(partition, {})
            if moved.n >= at.n:
                marks.pop(mark_of, None)  # (caught up: back in the main pass)
            else:
                marks[mark_of] = moved
            return Outcome.DONE
        if advance is None:
            if not self._ours(partition, at):  # (out, and handed on again by the next holder)
                return Outcome.GONE
            self.positions[partition] = moved
            return Outcome.DONE
        if not ADVANCE.read(replies[-1]).done:
            return Outcome.LOST
        self.positions[partition] = self.stored[partition] = moved
        return Outcome.DONE

    async def _send_to_bus(self, calls: list[list[Any]]) -> list[Any]:
        """The bus on a Redis of its own: no one pipeline spans it and the position. The
        calls' replies are awaited; the position is stored later, in strict one fsync for
        every batch of a moment instead of one each (docs/decisions/0060). A crash before it
        is stored hands the events on again, with the same call ids (at least once, as
        ever). The bus Redis need not fsync: a call it loses is lost with it (0056)."""
        replies = await self.state.bus_conn.pipeline(calls)
        passing = _held_back(replies)
        if passing is not None:  # (LOADING after its restart, full ...: not handed on, retried)
            raise redis_error(passing, "handing on trigger calls")
        return replies

    async def _send(self, partition: int, calls: list[list[Any]], advance: list[Any]
                    ) -> list[Any]:
        """The calls and the position's (or a mark's) move on the wire (one Redis); their
        replies."""
        if not calls:  # (a mark dropped: nothing to confirm first)
            return await pipeline(self.state.conn, self.state.library, [advance])
        if self.state.confirm.needed:
            # `strict`: the calls confirmed (on a cluster their streams may be on another
            # primary than the position) before the position moves past their events, so a
            # failover cannot lose a call whose event the position already passed. Not
            # confirmed: dispatch pauses and goes on from the position in Redis.
            replies = await pipeline(self.state.conn, self.state.library, calls)
            missing = await self.state.confirm.missing(self.state.conn)
            if missing is not None:
                raise Unavailable(f"partition {partition}: handler calls {missing}")
            return replies + await pipeline(self.state.conn, self.state.library, [advance])
        return await pipeline(self.state.conn, self.state.library, [*calls, advance])

    async def handler_call(self, matcher: Matcher, event: Event,
                            partition: int) -> list[Any] | None:
        """The handler call's XADD, or None when its condition skips the event."""
        trigger = matcher.trigger
        call_id = call_id_of(trigger.id, partition, event.revision)
        payload: msgspec.Raw | None = None
        if matcher.is_barrier:
            payload = await self.conditions.barrier(matcher, event, call_id)
            if payload is None:
                return None
        elif matcher.condition is not None and \
                not await self.conditions.holds(matcher, event, call_id):
            return None
        return call_entry(self._target(trigger, partition), call_id,  # no reply
                          trigger.function_id, document_json(event, payload), "", caller="state",
                          context=None if event.traceparent is None else self._delivery(
                              trigger, event.traceparent, call_id, partition))

    def _delivery(self, trigger: Trigger, traceparent: str, call_id: str,
                  partition: int) -> dict[str, str] | None:
        """A traced event's trigger call: its delivery span (tracing.py, child of the span of
        the call that wrote the event) and the call's context naming it (`traceparent`), so
        the handler's span continues the trace."""
        span = tracing.start_delivery(trigger.function_id, traceparent, call_id, trigger.id)
        if span is None:
            return None
        self._sending.setdefault(partition, []).append(span)
        return tracing.carried(span)


def _held_back(replies: list[Any]) -> ReplyError | None:
    """The first call Redis refused for now, not for good: a transient state (LOADING after a
    restart ...) or out of memory (maxmemory: the calls' streams may take them once a caller
    frees memory). Such calls are not handed on, so the position must not pass their events:
    the batch is retried from the position stored. (Refused for good, WRONGTYPE or NOPERM,
    a call is counted in `append_errors` and passed: retrying would stop the partition.)"""
    return next((r for r in replies if refused_for_now(r)), None)
