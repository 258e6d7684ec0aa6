"""The trigger dispatcher: partition events -> handler calls on the target services' streams.

One loop per replica (in `stateworker serve`). It blocks on ONE `XREAD` over the registry
stream and the event streams of the partitions it leases (reactive/leases.py), so a write
wakes it at once and a trigger change reaches it as fast as an event (it rereads the triggers
the registry entries name, or all of them: reactive/trigger_reads.py). Each partition's batch
goes to reactive/batch.py (matching, conditions, handler calls, the move of the position);
rounds (reactive/leases.py, reactive/trimming.py) renew and share the leases, store the
positions, trim and flush the counters. In `acl` mode a trigger's owner must still be granted
the event (guard.trigger_granted).

At-least-once: the position moves only after the batch's calls are appended (same pipeline,
in order), so a crash re-dispatches the batch with the same call ids, and a handler on
`stateworker.Worker` runs once per id. Order: one partition is dispatched by one replica at
a time, in stream order; the events of a scope are in one partition.

A slow condition holds up only its own partition, and there only what follows it: while a
trigger has a bus condition, each partition's batch runs in a task of its own, left out of
the reads until it ends; the loop goes on reading the others and running the rounds, which
keep every lease held (a condition may take 60 s, far past `lease_ms`). Without one (none,
or only barriers, which run in Redis), batches run in the loop itself (no task to pay for).
The rounds also remove the streams of targets no trigger needs (reactive/targets.py).

A trigger whose target stream is full (the backlog) is set aside (reactive/batch.py) and its
partition goes on; a partition with set-aside triggers gets a catch-up pass (reactive/aside.py)
at most every CHECK_S, run where its batches run (loop or task), never beside one of them.

With no trigger there is nothing to hand on: the events are not read, and each round moves
the positions to the streams' ends, if there is still no trigger once the ends are read (one
registered meanwhile, not yet loaded, must see what came after it).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from stateworker.errors import StateError
from stateworker.logs import repeats
from stateworker.reactive import aside, trigger_reads, trimming
from stateworker.reactive.batch import Batches, Outcome
from stateworker.reactive.conditions import Conditions
from stateworker.reactive.event_bytes import Ledger
from stateworker.reactive.follower import follow
from stateworker.reactive.leases import Leases
from stateworker.reactive.matching import TriggerSet
from stateworker.reactive.status import Counts
from stateworker.reactive.targets import Targets
from stateworker.reactive.trimming import Position
from stateworker.schemas import Trigger
from stateworker.scripts.upkeep_bindings import ADVANCE, advance_call
from stateworker.state.core import guard, validate
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import triggers
from stateworker.transport.connect import connection_like
from stateworker.transport.plans import pipeline
from stateworker.transport.retry import Backoff, transient_reason
from stateworker.transport.streamread import StreamReader
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.reactive.dispatcher")

BATCH = 512  # events read per partition per round trip
ROUND_S = 1.0  # leases, trimming, counters at least this often (5 times a lease: renew_s)
ASIDE_BLOCK_MS = 50  # a read's wait while a batch runs aside (then its partition is read)
# A split bus's hand-on moves the position in memory only (reactive/batch.py): stored this
# often (one pipeline), so a crash hands on again at most this much (decision 0060).
STORE_S = 0.1
Work = Callable[[], Awaitable[Outcome]]  # a partition's batch, or its catch-up pass


class Dispatcher:
    """Runs until `stop()`; `hidden(scope)` says which scopes triggers never see (reserved
    and claimed ones)."""

    def __init__(self, state: RedisState, hidden: Callable[[str], bool] | None = None) -> None:
        # A connection of its own for its reads and writes: a batch's deliveries never wait
        # behind the bus's pipelines (issue 24), nor the bus's calls behind them.
        state = self.state = state.on_own_connection()
        self.replica = f"{uuid.uuid4().hex[:12]}"
        self.leases = Leases(state, self.replica)
        self.positions: dict[int, Position] = {}  # where dispatch is (may be ahead of...)
        self.stored: dict[int, Position] = {}  # ... what is stored in Redis
        # partition -> trigger id -> its mark, while set aside (reactive/aside.py; each mark
        # written to Redis as it changes, read back when the partition is taken)
        self.marks: dict[int, dict[str, Position]] = {}
        self.triggers = TriggerSet()
        self.registry_id = "0-0"
        self.hidden = hidden or (lambda scope: scope in validate.RESERVED_SCOPES
                                 or state.claims.is_claimed(scope))
        self.counts = Counts(state.conn, state.keys.dispatch_stats, state.keys.dispatch_by_trigger)
        self.conditions = Conditions(state, self.counts)
        self.batches = Batches(state, self.leases, self.conditions, self.counts,
                               lambda: self.triggers, self.hidden,
                               functools.partial(guard.trigger_granted, state),  # (acl mode)
                               self.positions, self.stored, self.marks)
        self.catch_up = aside.CatchUp(state, self.batches)
        self.targets = Targets(state)  # (the streams of targets no trigger names, removed)
        # Blocking reads of the registry and the held partitions (one per slot on a cluster).
        self._reader = StreamReader(connection_like(state.conn))
        self._last_round = self._last_store = 0.0
        self._scope = anyio.CancelScope()
        self._tg: TaskGroup
        self._aside: set[int] = set()  # partitions whose batch runs in a task of its own
        self._checked: dict[int, float] = {}  # partition -> its set-aside triggers' last pass
        # partition -> (its position in memory, the one stored) when its lease went (`_lapse`)
        self._lapsed: dict[int, tuple[Position, Position]] = {}
        self._ledgers: dict[int, Ledger] = {}  # the held streams' bytes (reactive/event_bytes.py)

    # ---- the loop ----------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Dispatch until `stop()`, leases given back at the end; started once the reader connects."""
        backoff = Backoff()
        log.info("dispatching", extra={"event": "dispatch.start", "replica": self.replica})
        try:
            async with anyio.create_task_group() as self._tg:  # (+ the condition clients)
                self.conditions.open(self._tg)
                with self._scope:
                    await self._reader.conn.try_connect()  # (Redis away: the reads retry)
                    task_status.started()
                    await follow(self._step, self._failed, backoff)
                self._tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    def stop(self) -> None:
        self._scope.cancel()

    async def _failed(self, exc: Exception) -> None:
        """A step failed: go on from the positions in Redis (once it is back, if it was away),
        those moved in memory stored first if Redis takes them (a split bus's hand-ons)."""
        if isinstance(exc, (StateError, ConnectionLost, ReplyError)):
            repeats.log(log, logging.WARNING, "dispatch paused: %s", exc,
                        extra={"event": "dispatch.paused"})
        else:  # a bug: the service goes on; the batch is retried
            log.error("dispatch failed", exc_info=exc, extra={"event": "dispatch.crashed"})
        await self._store_what_moved()
        self.positions.clear()
        self.stored.clear()

    async def _store_what_moved(self) -> None:
        """`_persist`, when Redis takes it: a position moves only once its calls are out, so
        what is stored is handed on (not storing it would hand it on again, and again while
        a failure repeats)."""
        try:
            await self._persist()
        except (StateError, ConnectionLost, ReplyError) as exc:
            log.warning("could not store the positions: %s", exc,
                        extra={"event": "dispatch.store_failed"})

    async def _close(self) -> None:
        try:
            await self._persist()
            await self.counts.flush()
            await self.leases.drop_all()
        except (StateError, ConnectionLost, ReplyError) as exc:
            log.warning("could not give back the leases: %s", exc,
                        extra={"event": "dispatch.stop_failed"})
        await self._reader.close()
        await self.state.close_own_connection()

    async def _step(self) -> None:
        now = anyio.current_time()
        round_s = min(ROUND_S, self.leases.renew_s)
        # (a split bus's hand-ons leave their positions unstored: stored within STORE_S)
        unstored = self.state.split_bus and any(
            self.stored.get(p) != position for p, position in self.positions.items())
        if now - self._last_round >= round_s or not self.leases.held:
            self._last_round = self._last_store = now
            await self._round()
        elif unstored and now - self._last_store >= STORE_S:
            self._last_store = now
            await self._persist()
        streams = [self.state.keys.registry]
        ids = [self.registry_id]
        # With no trigger there is nothing to hand on: the rounds move the positions to the
        # streams' ends instead, and the events are not read. With triggers paused (the live
        # `triggers_enabled` false) they are not read either: the positions stay, trimming too.
        enabled = self.state.settings.triggers_enabled
        held = [p for p in sorted(self.positions) if p not in self._aside] \
            if self.triggers.count and enabled else []
        for partition in held:
            streams.append(self.state.keys.partition(partition).events)
            ids.append(self.positions[partition].id)
        marked = any(self.marks.values()) and enabled
        block_ms = ASIDE_BLOCK_MS if self._aside or marked else int(round_s * 1000)
        if unstored:  # (stored once the wait ends: STORE_S after the last store)
            left = STORE_S - (anyio.current_time() - self._last_store)
            block_ms = min(block_ms, max(1, int(left * 1000)))
        reply = await self._reader.read(["XREAD", "COUNT", BATCH, "BLOCK", block_ms],
                                        streams, ids)
        if marked:
            await self._catch_up()
        if not reply:
            return
        by_stream = {name: entries for name, entries in reply}
        registry = by_stream.pop(self.state.keys.registry.encode(), None)
        if registry:
            await self._follow_registry(registry)
        aside = self.triggers.asks_the_bus
        for partition in held:
            entries = by_stream.get(self.state.keys.partition(partition).events.encode())
            if not entries or partition not in self.positions or partition in self._aside:
                continue
            await self._dispatch(partition, functools.partial(self.batches.run, partition,
                                                               entries), aside)

    async def _catch_up(self) -> None:
        """A catch-up pass of each held partition with marks, its last CHECK_S ago, no batch on."""
        now = anyio.current_time()
        for partition in sorted(p for p, marks in self.marks.items() if marks):
            if partition not in self.positions or partition in self._aside \
                    or now - self._checked.get(partition, 0.0) < aside.CHECK_S:
                continue
            self._checked[partition] = now
            await self._dispatch(partition, functools.partial(self.catch_up.run, partition),
                                 self.triggers.asks_the_bus)

    async def _dispatch(self, partition: int, work: Work, aside: bool) -> None:
        """A batch or catch-up pass: in a task while a trigger asks the bus, else here."""
        if aside:
            self._aside.add(partition)
            self._tg.start_soon(self._dispatch_aside, partition, work)
        else:  # (one partition's failure is its own: the others go on)
            await self._dispatch_or_forget(partition, work)

    async def _round(self) -> None:
        """Leases (renew, take, give back the excess), trimming, counters."""
        excess = [p for p in self.leases.excess() if p not in self._aside]  # (later, then)
        if excess:
            # Stored before they go (a split bus's hand-ons move positions in memory): the
            # next holder starts where this one got, and hands nothing on again.
            await self._persist()
            await self.leases.drop(excess)
        taken = await self.leases.round()
        for partition in list(self.positions):
            if partition not in self.leases.held:
                self._lapse(partition)
        for partition in sorted(taken | (self.leases.held - set(self.positions))):
            stored = await trimming.position(self.state, partition, self.leases.token)
            self.marks[partition] = await aside.load(self.state, partition)
            # (lapsed at a store or a round before, or lost and taken back in this round's
            # renew-then-take: still in `positions`)
            lapsed = self._lapsed.pop(partition, None)
            moved, stored_here = lapsed if lapsed is not None else (
                self.positions.get(partition), self.stored.get(partition))
            # A lease that ran out before its renewal, taken straight back: Redis holds what
            # this replica stored, so no one moved it since, and the moves in memory stand.
            self.positions[partition] = moved if moved and stored_here == stored else stored
            self.stored[partition] = stored
        if self.registry_id == "0-0":
            await self.reload_triggers()
        if not self.triggers.count:
            await self._skip_to_ends()
        await self._persist()
        # Trimmed below what is stored (not what is only in memory): a successor resumes
        # from the stored positions and finds every event it has to read again. A partition
        # whose batch runs aside is trimmed at a later round (its position is the batch's).
        settled = {p: position for p, position in self.stored.items() if p not in self._aside}
        cut = await trimming.trim(self.state, settled, self.leases.token, self._ledgers,
                                  self.marks)
        for partition, position in cut.items():
            if partition in self.positions and partition not in self._aside:
                self.positions[partition] = self.stored[partition] = position
        await self.counts.flush()
        await self.targets.round(self.triggers.triggers)

    async def _skip_to_ends(self) -> None:
        """No trigger: the positions to the streams' ends read, if there is still none once
        they are read (one registered meanwhile, not yet loaded, must get the events after
        its start: the next read loads it, and the events are read)."""
        held = sorted(p for p in self.positions if p not in self._aside)
        ends = await trimming.infos(self.state, held)
        if await self.state.conn.execute("HLEN", self.state.keys.triggers):
            return
        for partition, info in zip(held, ends, strict=True):
            position = self.positions.get(partition)  # (a batch aside may have lost it)
            if position is not None and info.added > position.n:
                self.positions[partition] = Position(info.last_id, info.added)

    async def _persist(self) -> None:
        """Store the positions that moved in memory only: past batches without handler calls
        (at the next round: a batch that hands nothing on costs no write of its own) and,
        with the bus on a Redis of its own, past hand-ons; there every moved position is
        stored within STORE_S (at most 1/STORE_S writes a second, whatever the batches)."""
        dirty = {p: position for p, position in sorted(self.positions.items())
                 if self.stored.get(p) != position}
        if not dirty:
            return
        commands = []
        for partition, position in dirty.items():
            keys = self.state.keys.partition(partition)
            commands.append(ADVANCE.command(self.state.library, *advance_call(
                keys.lease, keys.dispatched, self.leases.token, position.id, position.n)))
        replies = await pipeline(self.state.conn, self.state.library, commands)
        for (partition, position), reply in zip(dirty.items(), replies, strict=True):
            if not ADVANCE.read(reply).done:
                self._lost(partition)
            elif partition in self.positions:  # (what was sent: a batch aside may be ahead)
                self.stored[partition] = position

    def _lost(self, partition: int) -> None:
        repeats.log(log, logging.WARNING, "partition %d: lease lost; its new holder goes on",
                    partition, extra={"event": "dispatch.lease_lost", "partition": partition})
        self.leases.held.discard(partition)
        self._lapse(partition)

    def _lapse(self, partition: int) -> None:
        """The partition's lease is gone: its positions kept aside, for a round that takes
        it back before anyone else moved it (`_round`)."""
        moved, stored = self.positions.pop(partition, None), self.stored.pop(partition, None)
        self.marks.pop(partition, None)  # (read again when it is taken back)
        self._ledgers.pop(partition, None)  # (its next holder trims it meanwhile)
        if moved is not None and stored is not None:
            self._lapsed[partition] = (moved, stored)

    async def _follow_registry(self, entries: list[Any]) -> None:
        """Registry entries read: the triggers they name read again, or all of them
        (reactive/trigger_reads.py says when)."""
        after, self.registry_id = self.registry_id, entries[-1][0].decode()
        changed = await trigger_reads.changed(self.state, entries, after, self.triggers.count,
                                              BATCH)
        if changed is None:
            await self.reload_triggers()
            return
        if self.state.split_bus:  # (a renewal names the services already loaded)
            held = self.triggers.matchers
            await self._make_groups([
                t for i, t in changed.items() if t is not None and (
                    i not in held or triggers.target_services([held[i].trigger])
                    != triggers.target_services([t]))])
        self.triggers.update(changed)
        self.conditions.prune(self.triggers.triggers())
        await self.counts.forget([i for i, trigger in changed.items() if trigger is None])

    async def reload_triggers(self) -> None:
        if self.registry_id == "0-0":  # first load: follow the registry from its end
            last = await self.state.conn.execute("XREVRANGE", self.state.keys.registry, "+",
                                                 "-", "COUNT", 1)
            self.registry_id = last[0][0].decode() if last else "0-0"
            if self.registry_id == "0-0":
                self.registry_id = "0-1"  # nothing yet: any first change is after this
        loaded = await trigger_reads.all_triggers(self.state)
        if self.state.split_bus:
            await self._make_groups(loaded)
        self.triggers = TriggerSet(loaded)
        self.conditions.prune(loaded)  # (clients of services no trigger names closed, when idle)
        await self.counts.prune(self.triggers.ids)

    async def _make_groups(self, loaded: list[Trigger]) -> None:
        """The bus on a Redis of its own: the targets' consumer groups made there (what a
        registration does on one Redis: state/reactive/triggers.py `with_groups`), before
        the triggers are used, so a worker that starts later reads every call handed on."""
        names = triggers.target_services(loaded)
        if not names:
            return
        replies = await self.state.bus_conn.pipeline(
            triggers.group_commands(self.state, names))
        for reply in replies:
            if isinstance(reply, ReplyError) and transient_reason(reply):
                raise reply  # (the bus away: the reload is retried)
        triggers.log_groups_not_made(self.state.settings, names, replies)

    # ---- one partition's batch ---------------------------------------------------------------
    async def _dispatch_aside(self, partition: int, work: Work) -> None:
        """One partition's batch (or catch-up) in a task of its own (module docstring)."""
        try:
            await self._dispatch_or_forget(partition, work)
        finally:
            self._aside.discard(partition)

    async def _dispatch_or_forget(self, partition: int, work: Work) -> None:
        """One partition's batch or catch-up pass. A failure costs this partition its position
        (and marks) in memory (the moves of the others stored first): the next round reads
        them again from Redis, and its batch is dispatched again from there."""
        try:
            if await work() is Outcome.LOST:
                self._lost(partition)
        except (StateError, ConnectionLost, ReplyError) as exc:
            log.warning("partition %d: dispatch paused: %s", partition, exc,
                        extra={"event": "dispatch.paused", "partition": partition})
        except Exception:  # a bug: the dispatcher goes on; the batch is retried
            log.exception("partition %d: dispatch failed", partition,
                          extra={"event": "dispatch.crashed", "partition": partition})
        else:
            return
        await self._store_what_moved()
        self._forget(partition)

    def _forget(self, partition: int) -> None:
        self.positions.pop(partition, None)
        self.stored.pop(partition, None)
        self.marks.pop(partition, None)
