"""A trigger's condition, evaluated for one event before its handler call is handed on.

`state::barrier` runs in Redis (token: the handler call's id, so a re-dispatched event gets the
same decision; on `allow` its payload goes into the handler's body). Any other function is
called over the bus, on `condition_service` (default: the trigger's service), with the event
document, call id `<handler call id>:condition` and the trigger's timeout (default 5 s, at
most 60 s): only an explicit `false` skips; an error or a timeout skips too, logged and
counted (`condition_errors`; skips: `condition_skips`). A condition whose call stream holds
the trigger backlog is not asked (`RESOURCE_EXHAUSTED`, skipped the same): a condition nobody
answers leaves its call on the stream, which would otherwise grow by one event document a
matching trigger at every event (`_room_on`).

One `StateClient` per condition service (two Redis connections), opened at its first
condition and held open in a task of the dispatcher's task group; it calls as the trusted
service, on its own stream and reply lists, in `acl` mode too. At most MAX_CLIENTS are kept,
the least recently used one given up past that, and a reload of the triggers gives up those of
services no trigger names any more (`prune`, with the parsed barriers of triggers gone): a
client given up is closed once no call is in flight on it (a new condition on its service
opens another). So triggers naming many condition services cost at most 2 x MAX_CLIENTS
connections of each replica, not two per service for as long as the dispatcher runs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from stateworker.bus.client import StateClient
from stateworker.clock import now_ms, rfc3339_ms
from stateworker.errors import ResourceExhausted, StateError, shown
from stateworker.events.model import Event, document_json
from stateworker.keys import bus_shard_stream
from stateworker.logs import repeats
from stateworker.reactive.matching import Matcher
from stateworker.reactive.status import Counts
from stateworker.schemas import BarrierDecision, Trigger
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import barrier, trigger_checks
from stateworker.state.reactive.barrier import BarrierCondition

log = logging.getLogger("stateworker.reactive.dispatcher")

MAX_CLIENTS = 32  # condition clients kept open by one dispatcher (two connections each)


class _Held:
    """A condition client, its calls in flight, and whether it was given up (closed once
    none is in flight: `closed` set ends the task holding it)."""

    def __init__(self, client: StateClient) -> None:
        self.client = client
        self.busy = 0
        self.given_up = False
        self.closed = anyio.Event()

    def give_up(self) -> None:
        self.given_up = True
        if self.busy == 0:
            self.closed.set()


class Conditions:
    """The conditions of one dispatcher; `open(task_group)` before the first bus condition."""

    def __init__(self, state: RedisState, counts: Counts) -> None:
        self.state = state
        self.counts = counts
        self._barriers: dict[str, tuple[Trigger, BarrierCondition]] = {}
        self._clients: OrderedDict[str, _Held] = OrderedDict()  # least recently used first
        self._opening = anyio.Lock()  # one condition client per service, however many ask
        self._tg: TaskGroup | None = None

    def open(self, task_group: TaskGroup) -> None:
        """Where the condition clients are held (the dispatcher's task group)."""
        self._tg = task_group

    async def barrier(self, matcher: Matcher, event: Event, token: str) -> msgspec.Raw | None:
        """The barrier's decision for this arrival; the payload on `allow`, else None."""
        trigger = matcher.trigger
        try:
            condition = self._barriers.get(trigger.id)
            if condition is None or condition[0] is not trigger:
                raw = trigger.config.condition_config
                parsed = barrier.parse_condition(
                    self.state.settings, None if isinstance(raw, msgspec.UnsetType) else raw,
                    owner=trigger.owner)
                condition = self._barriers[trigger.id] = (trigger, parsed)
            result: BarrierDecision = await self.state.execute(barrier.barrier_plan(
                self.state, document_json(event), condition[1], token))
        except StateError as exc:
            self._failed(matcher, event, exc)
            return None
        if result.decision != "allow" or isinstance(result.payload, msgspec.UnsetType):
            self.counts.add("condition_skips")
            return None
        return result.payload

    async def holds(self, matcher: Matcher, event: Event, call_id: str) -> bool:
        """A bus condition's answer for the event: False only on an explicit `false`, an
        error or a timeout."""
        trigger = matcher.trigger
        service = trigger.config.condition_service or trigger.service
        timeout_s = (trigger.config.condition_timeout_ms or
                     trigger_checks.DEFAULT_CONDITION_TIMEOUT_MS) / 1000
        try:
            await self._room_on(service, event)
            async with self._client(service) as client:
                result = await client.call_json(matcher.condition or "", document_json(event),
                                                timeout=timeout_s,
                                                call_id=f"{call_id}:condition")
        except StateError as exc:
            self._failed(matcher, event, exc)
            return False
        if result.strip() == b"false":
            self.counts.add("condition_skips")
            return False
        return True

    async def _room_on(self, service: str, event: Event) -> None:
        """RESOURCE_EXHAUSTED when the condition's call stream (the shard its call goes to, as
        the handler calls': the event's partition) holds the trigger backlog: a condition
        nobody answers leaves its call there for good (a timeout does not take it back), so
        a trigger on a dead condition service would add an entry, the event's document, at
        each event it matches, without end (measured: 20 such triggers, 50 writes of 10 KB,
        12.8 MB of calls nobody reads), and every trigger naming it the same once more. The
        condition is not asked then and the event is skipped for the trigger, as at a
        timeout; the partition goes on (nothing waits for a stream a worker may never
        drain)."""
        settings = self.state.settings
        stream = bus_shard_stream(settings.prefix, service,
                                  self.state.keys.partition_of(event.scope) % settings.bus_shards)
        length = await self.state.bus_conn.execute("XLEN", stream)
        if isinstance(length, int) and length >= settings.trigger_backlog:
            raise ResourceExhausted(
                f"config.condition_service: the call stream of condition service "
                f"{shown(service)} holds {length} calls, the limit is the trigger backlog of "
                f"{settings.trigger_backlog} (STATEWORKER_TRIGGER_BACKLOG): the condition is "
                "not asked, the event is skipped, until a worker of the service drains it",
                {"path": "config.condition_service", "service": service, "size": length,
                 "limit": settings.trigger_backlog})

    def _failed(self, matcher: Matcher, event: Event, exc: StateError) -> None:
        self.counts.add("condition_errors")
        self.counts.failed(matcher.trigger.id, {
            "ts": rfc3339_ms(now_ms()), "code": exc.code, "message": str(exc),
            "condition": matcher.condition, "revision": event.revision})
        # Said once every REPEAT_S a kind of failure (logs.py): a line each was one per
        # trigger per event (measured: 20 triggers on a dead condition service, 50 writes,
        # 1,000 warnings), so a caller's triggers flooded the log with every write anyone
        # made; each trigger's last failure stays in `status` (`last_error`).
        repeats.log(log, logging.WARNING, "trigger %s: condition %s failed for revision %s "
                    "(skipped): %s", matcher.trigger.id, matcher.condition, event.revision, exc,
                    extra={"event": "dispatch.condition_failed", "trigger": matcher.trigger.id,
                           "code": exc.code})

    def prune(self, loaded: Iterable[Trigger]) -> None:
        """After a reload of the triggers: the parsed barriers of triggers gone forgotten, and
        the clients of services no trigger's bus condition names given up."""
        loaded = list(loaded)
        ids = {trigger.id for trigger in loaded}
        for gone in [tid for tid in self._barriers if tid not in ids]:
            del self._barriers[gone]
        named = {trigger.config.condition_service or trigger.service for trigger in loaded
                 if trigger.config.condition_function_id not in (None, trigger_checks.BARRIER)}
        for service in [s for s in self._clients if s not in named]:
            self._clients.pop(service).give_up()

    @asynccontextmanager
    async def _client(self, service: str) -> AsyncIterator[StateClient]:
        """The service's client for one call (counted in flight while it runs)."""
        held = self._clients.get(service)
        if held is None:
            async with self._opening:  # (two batches asking at once open one client)
                held = self._clients.get(service)
                if held is None:
                    if self._tg is None:
                        raise RuntimeError("Conditions.open was not called")
                    held = await self._tg.start(self._hold_client, service)
                    self._clients[service] = held
        self._clients.move_to_end(service)
        held.busy += 1
        while len(self._clients) > MAX_CLIENTS:  # (never this one: the most recent)
            self._clients.popitem(last=False)[1].give_up()
        try:
            yield held.client
        finally:
            held.busy -= 1
            if held.given_up and held.busy == 0:
                held.closed.set()

    async def _hold_client(self, service: str, *, task_status: TaskStatus[_Held]) -> None:
        trusted = msgspec.structs.replace(self.state.settings, auth="off")
        async with StateClient(settings=trusted, service=service, caller="state") as client:
            held = _Held(client)
            task_status.started(held)
            await held.closed.wait()
