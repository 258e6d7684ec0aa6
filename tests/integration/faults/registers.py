"""Clients that record a history for the linearizability checker (tests/linearizability.py):
each its own StateClient (its own reply list) calling a `stateworker serve` over the bus,
each op a get (state::get-entry), a set (state::set), a compare-and-set on the version
(state::set with expected_version) or on the value (state::compare-and-set), on a few
registers (scope, key), every value written unique. Each op is recorded with its invocation
and completion (time.monotonic) and its answer:

- a result, or CONFLICT (a refused compare-and-set: a definite outcome, nothing written);
- no answer, for any other error (TIMEOUT, UNAVAILABLE from the service, a lost connection):
  the op may have taken effect, or not;
- left out: UNAVAILABLE with `sent: false`, a call that never reached the bus (the client
  says it will never be applied; if it were, the checker would see a value nobody wrote).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import anyio
from anyio.abc import TaskGroup

from stateworker import StateClient
from stateworker.errors import Conflict, StateError, Unavailable
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.linearizability import Kind, Op, Value

CALL_TIMEOUT_S = 2.0  # a call's whole time (its re-sends included); past it: no answer
KINDS: list[Kind] = ["get", "get", "get", "set", "set", "cas", "cas", "swap"]


class Clients:
    """`start(tg)` runs `count` clients until `stop()`; `pause()` holds them before their next
    op (the op in flight, if any, ends as it ends) and `resume()` lets them go on."""

    def __init__(self, settings: Settings, registers: list[tuple[str, str]], count: int,
                 seed: int) -> None:
        self.settings = settings
        self.registers = registers
        self.count = count
        self.seed = seed
        self.history: list[Op] = []
        self.not_sent = 0  # calls that never reached the bus (left out of the history)
        self.codes: Counter[str] = Counter()  # the errors of the ops without an answer
        self.in_flight = 0
        self.started = 0  # ops started
        self._going = anyio.Event()
        self._going.set()
        self._stopping = False
        self.opened = 0

    @property
    def answered(self) -> int:
        return sum(op.output is not None for op in self.history)

    @property
    def unanswered(self) -> int:
        return len(self.history) - self.answered

    def start(self, tg: TaskGroup) -> None:
        for n in range(self.count):
            tg.start_soon(self._client, n)

    async def opened_all(self, within_s: float = 30) -> None:
        await until(lambda: self.opened == self.count, within_s, "every client connected")

    def stop(self) -> None:
        self._stopping = True
        self._going.set()

    def pause(self) -> None:
        self._going = anyio.Event()

    def resume(self) -> None:
        self._going.set()

    async def idle(self, within_s: float) -> None:
        """Paused, wait until no op is in flight."""
        await until(lambda: self.in_flight == 0, within_s, "the ops in flight to end")

    async def progress(self, ops: int, within_s: float, what: str = "") -> None:
        """Wait until `ops` more ops were answered."""
        target = self.answered + ops
        await until(lambda: self.answered >= target, within_s,
                    f"{ops} more answered ops {what}({self.summary()})")

    async def an_op_started(self, within_s: float, what: str) -> None:
        """Wait until one more op was started."""
        before = self.started
        await until(lambda: self.started > before, within_s, f"an op started {what}")

    async def no_send_rerouted(self, within_s: float) -> None:
        """On a cluster, wait until no client's send is still being re-routed in the
        background: ClusterConnection.send_pipeline hands a send it cannot place (a failover
        under way) to a task of its own that retries after the call gave up, and close()
        leaves it running; woken after close(), it opens a connection that is never closed
        (a ResourceWarning when the loop ends). Closing the clients after them avoids it."""
        def none() -> bool:
            return not any(getattr(task.get_coro(), "__qualname__", "") == "ClusterConnection._run"
                           for task in asyncio.all_tasks())

        await until(none, within_s, "the clients' re-routed sends to end")

    async def an_op_unanswered(self, within_s: float, what: str) -> None:
        """Wait until one more op ended without an answer or was never sent: the fault in
        place is met by the clients (calls in flight through it), not merely survived."""
        before = self.unanswered + self.not_sent
        await until(lambda: self.unanswered + self.not_sent > before, within_s,
                    f"an op without an answer {what}({self.summary()})")

    def summary(self) -> str:
        return (f"{self.answered} ops answered, {self.unanswered} without an answer "
                f"{dict(self.codes)}, {self.not_sent} never sent")

    def unanswered_writes(self) -> tuple[int, int]:
        """(writes without an answer, those of them whose value an answered op saw: they took
        effect; the others may have or not)."""
        seen = {value for op in self.history for value in op.output or ()}
        lost = [op for op in self.history if op.output is None and op.kind != "get"]
        return len(lost), sum(op.input[-1] in seen for op in lost)

    async def _client(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        seen: dict[str, tuple[Value, int]] = {}  # per register: the last value, version seen
        async with StateClient(settings=self.settings, timeout=CALL_TIMEOUT_S) as client:
            self.opened += 1
            serial = 0
            while True:
                await self._going.wait()
                if self._stopping:
                    return
                scope, key = rng.choice(self.registers)
                name = f"{scope}/{key}"
                kind = rng.choice(KINDS)
                serial += 1
                new = f"c{n}-{serial}"  # unique over the whole history
                value, version = seen.get(name, (None, 0))
                op_input: tuple[Value, ...] = {"get": (), "set": (new,), "cas": (version, new),
                                               "swap": (value, new)}[kind]
                self.in_flight += 1
                self.started += 1
                invoke = time.monotonic()
                try:
                    output = await self._call(client, kind, scope, key, op_input)
                except Conflict as refused:
                    output = ("conflict", refused.details["current_version"])
                except Unavailable as unavailable:
                    if unavailable.details.get("sent") is False:
                        self.not_sent += 1
                        self.in_flight -= 1
                        continue
                    self.codes[unavailable.code] += 1
                    output = None
                except StateError as error:
                    self.codes[error.code] += 1
                    output = None
                complete = time.monotonic()
                self.in_flight -= 1
                self.history.append(Op(n, name, kind, op_input, output, invoke, complete))
                seen[name] = _seen(kind, op_input, output, seen.get(name, (None, 0)))

    async def _call(self, client: StateClient, kind: Kind, scope: str, key: str,
                    op_input: tuple[Value, ...]) -> tuple[Value, ...]:
        """One op over the bus; its output in the checker's form."""
        where: dict[str, Any] = {"scope": scope, "key": key}
        if kind == "get":
            entry = await client.call("state::get-entry", where)
            return (entry["value"], entry["version"]) if entry["found"] else (None, 0)
        if kind == "set":
            done = await client.call("state::set", {**where, "value": op_input[0]})
            return done["old_value"], done["version"]
        if kind == "cas":
            done = await client.call("state::set", {**where, "value": op_input[1],
                                                    "expected_version": op_input[0]})
            return "ok", done["old_value"], done["version"]
        swap = await client.call("state::compare-and-set", {**where, "value": op_input[1],
                                                             "expected": op_input[0]})
        return ("swapped",) if swap["swapped"] else ("current", swap["current"])


def _seen(kind: Kind, op_input: tuple[Value, ...], output: tuple[Value, ...] | None,
          before: tuple[Value, int]) -> tuple[Value, int]:
    """What a client knows of a register after an op: the expected value and version its
    next compare-and-set uses (a stale one makes a refusal, which the history wants too)."""
    if output is None:
        return before
    if kind == "get":
        return output[0], int(output[1] or 0)
    if kind == "set" or output[0] == "ok":
        return op_input[-1], int(output[-1] or 0)
    if output[0] == "conflict":
        return before[0], int(output[1] or 0)
    if output[0] == "swapped":
        return op_input[-1], before[1] + 1
    return output[1], before[1]
