"""One partition's batch of events -> handler calls, and the move of the partition's position.

For each event, in stream order: the triggers it reaches (reactive/matching.py: filters, match
rules, `acl` mode's grants, and the trigger's start: an event at or before the revision a
trigger started at is not its), their conditions (reactive/conditions.py), and one handler
call each (XADD to `<prefix>:bus:<service>`, id `<trigger id>:p<partition>:<revision>`,
fire-and-forget, `call_id_of`).

The calls go out in ONE pipeline, followed by the move of the position (`lua/advance.lua`,
only while the lease holds): at-least-once, since a crash before the move re-dispatches the
events with the same call ids. Before a bus condition is asked, the calls gathered so far go
out with the position moved to the last event whose calls are all out: the events ahead of a
pending condition are never held up by it; only what follows it in its partition waits. A
batch that hands nothing on moves the position in memory only (stored at the next round).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

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
from stateworker.scripts.bindings import ADVANCE, advance_call
from stateworker.state.store import RedisState
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ReplyError

log = logging.getLogger("stateworker.reactive.dispatcher")


def call_id_of(trigger_id: str, partition: int, revision: str) -> str:
    """A handler call's id: one per trigger and event. A revision (stream id) is unique
    within its partition only (two partitions can write the same id in the same
    millisecond), so the id names the partition too."""
    return f"{trigger_id}:p{partition}:{revision}"


class Batches:
    """Dispatches the batches of one dispatcher's partitions. `positions` and `stored` are the
    dispatcher's (where dispatch is; what Redis holds), moved here as calls go out."""

    def __init__(self, state: RedisState, leases: Leases, conditions: Conditions,
                 counts: Counts, triggers: Callable[[], TriggerSet],
                 hidden: Callable[[str], bool], granted: Callable[[Trigger, str], bool],
                 positions: dict[int, Position], stored: dict[int, Position]) -> None:
        self.state = state
        self.leases = leases
        self.conditions = conditions
        self.counts = counts
        self.triggers = triggers  # the current registrations (reloaded by the dispatcher)
        self.hidden = hidden
        self.granted = granted
        self.positions = positions
        self.stored = stored
        # The delivery spans of traced events' calls not sent yet, by partition (its batches
        # may run in tasks of their own): each ends once its call is out (`_hand_on`).
        self._sending: dict[int, list[Span]] = {}

    async def run(self, partition: int, entries: list[Any]) -> bool:
        """Hand on one partition's batch (stream entries read after its position); False
        when the lease was lost (nothing more is handed on)."""
        start = self.positions[partition]
        calls: list[list[Any]] = []
        self._sending.pop(partition, None)  # (a failed batch's: never sent, never exported)
        for index, (entry_id, flat) in enumerate(entries):
            event = self._event(partition, entry_id, flat)
            if event is None:
                continue
            for matcher in self.triggers().matching(event, self.granted, partition):
                if matcher.asks_the_bus and calls:  # (what is ahead goes out first)
                    before = Position(entries[index - 1][0].decode(), start.n + index) \
                        if index else start
                    if not await self._hand_on(partition, calls, before):
                        return False
                    calls = []
                call = await self._handler_call(matcher, event, partition)
                if call is not None:
                    calls.append(call)
                    self.counts.handed_on(matcher.trigger.id)
        moved = Position(entries[-1][0].decode(), start.n + len(entries))
        if calls:
            return await self._hand_on(partition, calls, moved)
        if partition in self.positions:  # (a round may have given it up meanwhile)
            self.positions[partition] = moved  # nothing handed on: stored at the next round
        return True

    def _event(self, partition: int, entry_id: bytes, flat: list[Any]) -> Event | None:
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

    async def _hand_on(self, partition: int, calls: list[list[Any]], moved: Position) -> bool:
        """The calls, then the position moved (one pipeline); False when the lease is lost."""
        keys = self.state.keys.partition(partition)
        advance = ADVANCE.command(self.state.library, *advance_call(
            keys.lease, keys.dispatched, self.leases.token, moved.id, moved.n))
        try:
            replies = await self._send(partition, calls, advance)
        finally:
            for span in self._sending.pop(partition, ()):  # (their calls out, or failed)
                span.end()
        failed = [r for r in replies[:-1] if isinstance(r, ReplyError)]
        if failed:
            self.counts.add("append_errors", len(failed))
            log.error("could not append %d handler calls: %s", len(failed), failed[0],
                      extra={"event": "dispatch.append_failed", "partition": partition})
        self.counts.add("handler_calls", len(calls) - len(failed))
        if not ADVANCE.read(replies[-1]).done:
            return False
        self.positions[partition] = self.stored[partition] = moved
        return True

    async def _send(self, partition: int, calls: list[list[Any]], advance: list[Any]
                    ) -> list[Any]:
        """The calls and the position's move on the wire; their replies."""
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

    async def _handler_call(self, matcher: Matcher, event: Event,
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
        # The shard of the event's partition: `partition_of(scope) % shards`, the rule every
        # caller follows (the document's `scope`), so one scope's calls keep their order.
        settings = self.state.settings
        stream = bus_shard_stream(settings.prefix, trigger.service,
                                  partition % settings.bus_shards)
        return call_entry(stream, call_id,  # no reply
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
