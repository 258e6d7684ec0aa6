"""`Targets`: the call streams of trigger targets that nobody needs any more, removed.

A registration makes its target service's stream and consumer group, so that no call is lost
before a worker starts (state/reactive/triggers.py `with_groups`; on a split bus the
dispatcher, when it loads the trigger), and names the service in the set of targets
(`<prefix>:dispatch:targets`, on the Redis of the bus). Nothing else removes them: a caller
registering triggers with a fresh `service` each time would leave ~700 bytes a name for good
(measured: ~550 registrations a second, ~1.3 GB an hour).

Every SWEEP_S the dispatcher's round asks which services of the set no trigger it has loaded
names, now and at its sweep before: a registration the dispatcher has not loaded yet is then
at least SWEEP_S old, where the registry reaches it in milliseconds. Each such service's
stream (every shard) is removed if it holds no call and none of its groups has a consumer,
checked and removed in one step (lua/droptarget.lua: a call handed on, or a worker come,
between a check and the removal would be lost with it), then the name leaves the set. A
stream kept stays in the set and is asked again at the next sweep: its calls wait for a
worker that may still come (they are its business: a worker started a day later reads
them), or a worker serves it (its own stream, for as long as it has a consumer: bus/upkeep.py
removes the dead ones).

Removing the empty group of a trigger registered a moment before is harmless: the first call
handed on makes the stream again, and a worker makes its group at `0` (bus/sources.py), so it
reads every call handed on before it started. Every replica sweeps (no lease: each removal is
one script, and a name two replicas remove is removed once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import anyio

from stateworker.errors import StateError
from stateworker.keys import STATE_SERVICE, bus_shard_stream
from stateworker.logs import repeats
from stateworker.schemas import Trigger
from stateworker.scripts.library import Library
from stateworker.scripts.upkeep_bindings import DROPTARGET, bus_library, droptarget_call
from stateworker.state.core.store import RedisState
from stateworker.state.reactive.triggers import target_services
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.dispatch")

SWEEP_S = 60.0  # between two sweeps of a replica; a name must be unnamed at two in a row
SCAN_COUNT = 500  # names of the set read a round trip (SSCAN)
REMOVED = 3  # droptarget.lua: the stream was removed (0: none there; 1, 2, -1: kept)


class Targets:
    """One dispatcher's sweeps of the trigger targets' streams."""

    def __init__(self, state: RedisState, sweep_s: float = SWEEP_S) -> None:
        self.state = state
        self.sweep_s = sweep_s
        self._last = float("-inf")  # (the first sweep only notes what is unnamed)
        self._unnamed: set[str] = set()  # unnamed at the sweep before
        self._library: Library | None = None  # the functions where the call streams are
        self.removed = 0  # streams removed by this replica since it started

    async def round(self, loaded: Callable[[], Iterable[Trigger]]) -> None:
        """A sweep if the last one is SWEEP_S old (`loaded()`: the triggers the dispatcher
        holds, listed only when a sweep is due)."""
        now = anyio.current_time()
        if now - self._last < self.sweep_s:
            return
        self._last = now
        try:
            await self.sweep(loaded())
        except (StateError, ConnectionLost, ReplyError) as exc:  # (asked again next time)
            repeats.log(log, logging.WARNING, "the sweep of trigger targets' streams failed: "
                        "%s", exc, extra={"event": "dispatch.target_sweep_failed"})

    async def sweep(self, loaded: Iterable[Trigger]) -> int:
        """Remove the streams no trigger needs (module docstring); how many were removed."""
        named = set(target_services(loaded)) | {STATE_SERVICE}
        unnamed = {name for name in await self._members() if name not in named}
        candidates, self._unnamed = sorted(unnamed & self._unnamed), unnamed
        removed = 0
        for name in candidates:
            if await self._remove(name):
                removed += 1
                self._unnamed.discard(name)
        if removed:
            self.removed += removed
            log.info("removed the streams of %d trigger targets no trigger names", removed,
                     extra={"event": "dispatch.targets_removed", "count": removed})
        return removed

    async def _members(self) -> set[str]:
        conn, key = self.state.bus_conn, self.state.keys.dispatch_targets
        names: set[str] = set()
        cursor = b"0"
        while True:
            cursor, batch = await conn.execute("SSCAN", key, cursor, "COUNT", SCAN_COUNT)
            names.update(n.decode(errors="replace") for n in batch)
            if cursor in (b"0", 0, "0"):
                return names

    async def _remove(self, name: str) -> bool:
        """`name`'s streams removed where nobody needs them, and the name from the set once
        none is left; whether it left the set."""
        settings = self.state.settings
        library = self._bus_library()
        commands = [DROPTARGET.command(library, *droptarget_call(
            bus_shard_stream(settings.prefix, name, n))) for n in range(settings.bus_shards)]
        replies = await pipeline(self.state.bus_conn, library, commands)
        kept = [r for r in replies if isinstance(r, ReplyError)
                or DROPTARGET.read(r).number not in (0, REMOVED)]
        if kept:
            failed = next((r for r in kept if isinstance(r, ReplyError)), None)
            if failed is not None:
                repeats.log(log, logging.WARNING, "trigger target %s: its stream could not be "
                            "looked at for removal: %s", name, failed,
                            extra={"event": "dispatch.target_sweep_failed", "service": name})
            return False
        await self.state.bus_conn.execute("SREM", self.state.keys.dispatch_targets, name)
        return True

    def _bus_library(self) -> Library:
        """The scripts where the call streams are (upkeep_bindings.bus_library)."""
        if self._library is None:
            self._library = bus_library(self.state.bus_conn)
        return self._library
