"""The trigger dispatcher: partition events -> handler calls on the target services' streams.

One loop per replica (in `stateworker serve`). It blocks on ONE `XREAD` over the registry
stream and the event streams of the partitions it leases (reactive/leases.py), so a write
wakes it at once and a trigger change reaches it as fast as an event. For each partition's
batch, in stream order, it finds the matching triggers (reactive/matching.py), evaluates
their conditions, and sends in ONE pipeline every handler call of the batch (XADD to
`<prefix>:bus:<service>`, id `<trigger id>:p<partition>:<revision>`, fire-and-forget), then
the move of the partition's position (`lua/advance.lua`, only while the lease holds). In
`acl` mode a trigger's owner must still be granted the event (guard.trigger_granted).

At-least-once: the position moves only after the batch's calls are appended (same pipeline,
in order), so a crash re-dispatches the batch with the same call ids, and a handler on
`stateworker.Worker` runs once per id. Order: one partition is dispatched by one replica at
a time, in stream order; the events of a scope are in one partition.

A slow condition holds up only its own partition: while a trigger has a bus condition, each
partition's batch runs in a task of its own, and the partition is left out of the reads
until it ends; the loop goes on reading the other partitions and running the rounds, which
keep every lease held (a batch may wait up to a condition's timeout, 60 s at most, far past
`lease_ms`). Without one (no condition, or only barriers, which run in Redis), batches run in
the loop itself, one after another (no task to pay for).

Conditions: `state::barrier` runs in Redis (token: the handler call's id, so a re-dispatched
event gets the same decision); any other function is called over the bus with the event
document (call id: the handler call's id + `:condition`) and the trigger's timeout; only an
explicit `false` skips; an error or a timeout skips too, logged and counted.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from stateworker.bus.client import StateClient
from stateworker.bus.protocol import call_entry
from stateworker.errors import StateError
from stateworker.events.model import Event, decode_event, document_json, fields_of
from stateworker.reactive import trimming
from stateworker.reactive.leases import Leases
from stateworker.reactive.matching import Matcher, TriggerSet
from stateworker.reactive.trimming import Position
from stateworker.schemas import BarrierDecision, Trigger
from stateworker.scripts.bindings import ADVANCE, advance_call
from stateworker.state import barrier, guard, triggers, validate
from stateworker.state.barrier import BarrierCondition
from stateworker.state.store import RedisState
from stateworker.transport.connection import RedisConnection
from stateworker.transport.plans import pipeline
from stateworker.transport.retry import Backoff
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.reactive.dispatcher")

BATCH = 512  # events read per partition per round trip
ROUND_S = 1.0  # leases, trimming, counters at least this often (5 times a lease: renew_s)
ASIDE_BLOCK_MS = 50  # a read's wait while a batch runs aside (then its partition is read)


def call_id_of(trigger_id: str, partition: int, revision: str) -> str:
    """A handler call's id: one per trigger and event. A revision (stream id) is unique
    within its partition only (two partitions can write the same id in the same
    millisecond), so the id names the partition too."""
    return f"{trigger_id}:p{partition}:{revision}"


class Dispatcher:
    """Runs until `stop()`; `hidden(scope)` says which scopes triggers never see (reserved
    and claimed ones)."""

    def __init__(self, state: RedisState, hidden: Callable[[str], bool] | None = None) -> None:
        self.state = state
        self.replica = f"{uuid.uuid4().hex[:12]}"
        self.leases = Leases(state, self.replica)
        self.positions: dict[int, Position] = {}  # where dispatch is (may be ahead of...)
        self.stored: dict[int, Position] = {}  # ... what is stored in Redis
        self.triggers = TriggerSet()
        self.registry_id = "0-0"
        self.hidden = hidden or (lambda scope: scope in validate.RESERVED_SCOPES
                                 or state.claims.is_claimed(scope))
        self.counts: dict[str, int] = {}
        self._barriers: dict[str, tuple[Trigger, BarrierCondition]] = {}
        self._granted = functools.partial(guard.trigger_granted, state)  # (acl mode's owners)
        self._clients: dict[str, StateClient] = {}
        self._reader = RedisConnection(state.conn.url, connect_timeout_s=state.conn.connect_timeout_s,
                                       read_timeout_s=state.conn.read_timeout_s)
        self._last_round = 0.0
        self._scope = anyio.CancelScope()
        self._tg: TaskGroup
        self._aside: set[int] = set()  # partitions whose batch runs in a task of its own
        self._opening = anyio.Lock()  # one condition client per service, however many ask

    # ---- the loop ----------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Dispatch until `stop()`, leases given back at the end; started once the reader connects."""
        backoff = Backoff()
        log.info("dispatching", extra={"event": "dispatch.start", "replica": self.replica})
        try:
            async with anyio.create_task_group() as self._tg:  # (+ the condition clients)
                with self._scope:
                    await self._reader.try_connect()  # (Redis away: the reads retry)
                    task_status.started()
                    while True:
                        try:
                            await self._step()
                            backoff.reset()
                        except (StateError, ConnectionLost, ReplyError) as exc:
                            # Redis away: go on from the positions in Redis once it is back.
                            log.warning("dispatch paused: %s", exc,
                                        extra={"event": "dispatch.paused"})
                            self.positions.clear()
                            self.stored.clear()
                            await anyio.sleep(backoff.next())
                        except Exception:  # a bug: the service goes on; the batch is retried
                            log.exception("dispatch failed", extra={"event": "dispatch.crashed"})
                            self.positions.clear()
                            self.stored.clear()
                            await anyio.sleep(backoff.next())
                self._tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    def stop(self) -> None:
        self._scope.cancel()

    async def _close(self) -> None:
        try:
            await self._persist()
            await self._flush_counts()
            await self.leases.drop_all()
        except (StateError, ConnectionLost, ReplyError) as exc:
            log.warning("could not give back the leases: %s", exc,
                        extra={"event": "dispatch.stop_failed"})
        await self._reader.close()

    async def _step(self) -> None:
        now = anyio.current_time()
        round_s = min(ROUND_S, self.leases.renew_s)
        if now - self._last_round >= round_s or not self.leases.held:
            self._last_round = now
            await self._round()
        streams = [self.state.keys.registry]
        ids = [self.registry_id]
        # With no trigger there is nothing to hand on: the rounds move the positions to the
        # streams' ends instead, and the events are not read at all.
        held = [p for p in sorted(self.positions) if p not in self._aside] \
            if self.triggers.count else []
        for partition in held:
            streams.append(self.state.keys.partition(partition).events)
            ids.append(self.positions[partition].id)
        block_ms = ASIDE_BLOCK_MS if self._aside else int(round_s * 1000)
        reply = await self._reader.execute("XREAD", "COUNT", BATCH, "BLOCK", block_ms,
                                           "STREAMS", *streams, *ids)
        if not reply:
            return
        by_stream = {name: entries for name, entries in reply}
        registry = by_stream.pop(self.state.keys.registry.encode(), None)
        if registry:
            self.registry_id = registry[-1][0].decode()
            await self.reload_triggers()
        aside = self.triggers.asks_the_bus
        for partition in held:
            entries = by_stream.get(self.state.keys.partition(partition).events.encode())
            if not entries or partition not in self.positions:
                continue
            if aside:
                self._aside.add(partition)
                self._tg.start_soon(self._dispatch_aside, partition, entries)
            else:
                await self._dispatch_batch(partition, entries)

    async def _round(self) -> None:
        """Leases (renew, take, give back the excess), trimming, counters."""
        excess = [p for p in self.leases.excess() if p not in self._aside]  # (later, then)
        if excess:
            await self.leases.drop(excess)
        taken = await self.leases.round()
        for partition in list(self.positions):
            if partition not in self.leases.held:
                del self.positions[partition]
                self.stored.pop(partition, None)
        for partition in sorted(taken | (self.leases.held - set(self.positions))):
            self.positions[partition] = self.stored[partition] = await trimming.position(
                self.state, partition, self.leases.token)
        if self.registry_id == "0-0":
            await self.reload_triggers()
        if not self.triggers.count:
            await self._skip_to_ends()
        await self._persist()
        # Trimmed below what is stored (not what is only in memory): a successor resumes
        # from the stored positions and finds every event it has to read again.
        cut = await trimming.trim(self.state, self.stored, self.leases.token)
        for partition, position in cut.items():
            self.positions[partition] = self.stored[partition] = position
        await self._flush_counts()

    async def _skip_to_ends(self) -> None:
        held = sorted(self.positions)
        for partition, info in zip(held, await trimming.infos(self.state, held), strict=True):
            if info.added > self.positions[partition].n:
                self.positions[partition] = Position(info.last_id, info.added)

    async def _persist(self) -> None:
        """Store the positions that moved past batches without handler calls (kept in memory
        until a round: a batch that hands nothing on costs no write)."""
        dirty = sorted(p for p, position in self.positions.items()
                       if self.stored.get(p) != position)
        if not dirty:
            return
        commands = []
        for partition in dirty:
            keys = self.state.keys.partition(partition)
            position = self.positions[partition]
            commands.append(ADVANCE.command(self.state.library, *advance_call(
                keys.lease, keys.dispatched, self.leases.token, position.id, position.n)))
        replies = await pipeline(self.state.conn, self.state.library, commands)
        for partition, reply in zip(dirty, replies, strict=True):
            if ADVANCE.read(reply).done:
                self.stored[partition] = self.positions[partition]
            else:
                self._lost(partition)

    def _lost(self, partition: int) -> None:
        log.warning("partition %d: lease lost; its new holder goes on", partition,
                    extra={"event": "dispatch.lease_lost", "partition": partition})
        self.leases.held.discard(partition)
        self._forget(partition)

    async def reload_triggers(self) -> None:
        if self.registry_id == "0-0":  # first load: follow the registry from its end
            last = await self.state.conn.execute("XREVRANGE", self.state.keys.registry, "+",
                                                 "-", "COUNT", 1)
            self.registry_id = last[0][0].decode() if last else "0-0"
            if self.registry_id == "0-0":
                self.registry_id = "0-1"  # nothing yet: any first change is after this
        raw = await self.state.conn.execute("HGETALL", self.state.keys.triggers)
        self.triggers = TriggerSet(triggers.decode_trigger(r) for r in raw[1::2])

    # ---- one partition's batch ---------------------------------------------------------------
    async def _dispatch_aside(self, partition: int, entries: list[Any]) -> None:
        """One partition's batch in a task of its own (module docstring). A failure costs this
        partition its position in memory: the next round reads it again from Redis, and its
        batch is dispatched again from there."""
        try:
            await self._dispatch_batch(partition, entries)
        except (StateError, ConnectionLost, ReplyError) as exc:
            log.warning("partition %d: dispatch paused: %s", partition, exc,
                        extra={"event": "dispatch.paused", "partition": partition})
            self._forget(partition)
        except Exception:  # a bug: the dispatcher goes on; the batch is retried
            log.exception("partition %d: dispatch failed", partition,
                          extra={"event": "dispatch.crashed", "partition": partition})
            self._forget(partition)
        finally:
            self._aside.discard(partition)

    def _forget(self, partition: int) -> None:
        self.positions.pop(partition, None)
        self.stored.pop(partition, None)

    async def _dispatch_batch(self, partition: int, entries: list[Any]) -> None:
        position = self.positions[partition]
        calls: list[list[Any]] = []
        for entry_id, flat in entries:
            fields = fields_of(flat)
            scope = fields.get(b"scope", b"").decode(errors="replace")
            if self.hidden(scope) or not self.triggers.candidates(scope):
                continue
            try:
                event = decode_event(entry_id, fields)
            except (KeyError, ValueError) as exc:  # not written by our scripts: skipped
                self._count("malformed_events")
                log.error("partition %d: entry %s is not a change event (%r); skipped",
                          partition, entry_id.decode(), exc,
                          extra={"event": "dispatch.malformed", "partition": partition})
                continue
            for matcher in self.triggers.matching(event, self._granted):
                call = await self._handler_call(matcher, event, partition)
                if call is not None:
                    calls.append(call)
        last = entries[-1][0].decode()
        moved = Position(last, position.n + len(entries))
        if not calls:  # nothing handed on: stored at the next round (or with the next calls)
            if partition in self.positions:  # (a round may have given it up meanwhile)
                self.positions[partition] = moved
            return
        keys = self.state.keys.partition(partition)
        advance = ADVANCE.command(self.state.library, *advance_call(
            keys.lease, keys.dispatched, self.leases.token, moved.id, moved.n))
        replies = await pipeline(self.state.conn, self.state.library, [*calls, advance])
        failed = [r for r in replies[:-1] if isinstance(r, ReplyError)]
        if failed:
            self._count("append_errors", len(failed))
            log.error("could not append %d handler calls: %s", len(failed), failed[0],
                      extra={"event": "dispatch.append_failed", "partition": partition})
        self._count("handler_calls", len(calls) - len(failed))
        if not ADVANCE.read(replies[-1]).done:
            self._lost(partition)
            return
        self.positions[partition] = self.stored[partition] = moved

    async def _handler_call(self, matcher: Matcher, event: Event,
                            partition: int) -> list[Any] | None:
        trigger = matcher.trigger
        call_id = call_id_of(trigger.id, partition, event.revision)
        payload: msgspec.Raw | None = None
        if matcher.is_barrier:
            payload = await self._barrier(matcher, event, call_id)
            if payload is None:
                return None
        elif matcher.condition is not None and not await self._condition(matcher, event, call_id):
            return None
        return call_entry(self.state.keys.bus_stream(trigger.service), call_id,  # no reply
                          trigger.function_id, document_json(event, payload), "", caller="state")

    async def _barrier(self, matcher: Matcher, event: Event, token: str) -> msgspec.Raw | None:
        """The barrier's decision for this arrival (its token: the handler call's id, so a
        re-dispatched event gets the same `allow`); the payload on `allow`."""
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
            self._condition_failed(matcher, event, exc)
            return None
        if result.decision != "allow" or isinstance(result.payload, msgspec.UnsetType):
            self._count("condition_skips")
            return None
        return result.payload

    async def _condition(self, matcher: Matcher, event: Event, call_id: str) -> bool:
        trigger = matcher.trigger
        service = trigger.config.condition_service or trigger.service
        timeout_s = (trigger.config.condition_timeout_ms or
                     triggers.DEFAULT_CONDITION_TIMEOUT_MS) / 1000
        try:
            client = await self._client(service)
            result = await client.call_json(matcher.condition or "", document_json(event),
                                            timeout=timeout_s, call_id=f"{call_id}:condition")
        except StateError as exc:
            self._condition_failed(matcher, event, exc)
            return False
        if result.strip() == b"false":
            self._count("condition_skips")
            return False
        return True

    def _condition_failed(self, matcher: Matcher, event: Event, exc: StateError) -> None:
        self._count("condition_errors")
        log.warning("trigger %s: condition %s failed for revision %s (skipped): %s",
                    matcher.trigger.id, matcher.condition, event.revision, exc,
                    extra={"event": "dispatch.condition_failed", "trigger": matcher.trigger.id,
                           "code": exc.code})

    async def _client(self, service: str) -> StateClient:
        client = self._clients.get(service)
        if client is None:
            async with self._opening:  # (two batches asking at once open one client)
                client = self._clients.get(service)
                if client is None:
                    client = await self._tg.start(self._hold_client, service)
        return client

    async def _hold_client(self, service: str, *,
                           task_status: TaskStatus[StateClient]) -> None:
        """One condition service's client, open as long as the dispatcher runs; it calls as
        the (trusted) service, on its own stream and reply lists, in `acl` mode too."""
        trusted = msgspec.structs.replace(self.state.settings, auth="off")
        async with StateClient(settings=trusted, service=service, caller="state") as client:
            self._clients[service] = client
            task_status.started(client)
            await anyio.sleep_forever()

    # ---- counters ----------------------------------------------------------------------------
    def _count(self, name: str, by: int = 1) -> None:
        if by:
            self.counts[name] = self.counts.get(name, 0) + by

    async def _flush_counts(self) -> None:
        if not self.counts:
            return
        counts, self.counts = self.counts, {}
        key = self.state.keys.dispatch_stats
        await self.state.conn.pipeline([["HINCRBY", key, name, by]
                                        for name, by in counts.items()])
