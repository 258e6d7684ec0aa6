"""Writers under load for the cluster's fault tests (a failover, a slot moved, a reshard): one
task per scope, each incrementing its scope's counter `n` until stopped, counting the
increments acknowledged and the calls that failed (with their errors), so a test can compare
the counters with exact counts afterwards."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from stateworker import StateError
from stateworker.keys import KeySpace

Call = Callable[[str, dict[str, Any]], Awaitable[Any]]  # StateStore.call / StateClient.call


def scopes_in(keys: KeySpace, partition: int, count: int) -> list[str]:
    """The first `count` scopes `m0`, `m1` ... that fall in `partition`."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        if keys.partition_of(f"m{n}") == partition:
            found.append(f"m{n}")
        n += 1
    return found


def increment(scope: str) -> dict[str, Any]:
    return {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "", "by": 1}]}


class Writers:
    """`start(tg)` runs one writer per scope; `stop()` ends them after their call in flight."""

    def __init__(self, call: Call, scopes: list[str]) -> None:
        self.call = call
        self.scopes = scopes
        self.done = [0] * len(scopes)  # acknowledged increments, per scope
        self.failed = [0] * len(scopes)  # calls that failed (they may or may not have run)
        self.errors: list[StateError] = []
        self._stop = anyio.Event()

    async def zero(self) -> None:
        """Each counter set to 0 first (the slot holds entries before the fault)."""
        for scope in self.scopes:
            await self.call("state::set", {"scope": scope, "key": "n", "value": 0})

    def start(self, tg: TaskGroup) -> None:
        for index in range(len(self.scopes)):
            tg.start_soon(self._write, index)

    def stop(self) -> None:
        self._stop.set()

    @property
    def acknowledged(self) -> int:
        return sum(self.done)

    @property
    def codes(self) -> set[str]:
        return {error.code for error in self.errors}

    async def go_on(self, calls: int, within_s: float) -> None:
        """Wait until `calls` more increments are acknowledged (polling the counts)."""
        target = self.acknowledged + calls
        with anyio.fail_after(within_s):
            while self.acknowledged < target:
                await anyio.sleep(0.01)

    async def values(self) -> list[Any]:
        """Each scope's counter now."""
        return [await self.call("state::get", {"scope": s, "key": "n"}) for s in self.scopes]

    async def _write(self, index: int) -> None:
        while not self._stop.is_set():
            try:
                await self.call("state::update", increment(self.scopes[index]))
            except StateError as exc:
                self.errors.append(exc)
                self.failed[index] += 1
                continue
            self.done[index] += 1
