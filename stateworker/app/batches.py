"""`Batches`: the HTTP face's calls in flight run together, as a bus batch does.

An HTTP request is one call; run alone, each would cost a round trip of its own. The plans
that arrive while the batcher is busy are taken at once, all of them, and run as one
`execute_many` (one pipeline per step); each batch runs in a task of its own, so a slow one
does not hold up the next. A call's result (or its StateError) reaches its request through
its own `_Slot`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from stateworker.errors import InternalError
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import Plan

log = logging.getLogger("stateworker.http")


class _Slot:
    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: Any = None


class Batches:
    """`execute(plan)` from any request; `run` (in the HTTP server's task group) batches."""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        self._send, self._receive = anyio.create_memory_object_stream[tuple[Plan, _Slot]](
            math.inf)

    async def execute(self, plan: Plan) -> Any:
        """The plan's result, or the StateError it ended with (returned, not raised)."""
        slot = _Slot()
        await self._send.send((plan, slot))
        await slot.done.wait()
        return slot.result

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Batch until cancelled (the server's end), then close the streams."""
        with self._send, self._receive:
            async with anyio.create_task_group() as tg:
                task_status.started()
                await self._batch(tg)

    async def _batch(self, tg: TaskGroup) -> None:
        async for first in self._receive:
            batch = [first]
            while True:  # whatever else is waiting: the same pipeline
                try:
                    batch.append(self._receive.receive_nowait())
                except anyio.WouldBlock:
                    break
            tg.start_soon(self._run_batch, batch)

    async def _run_batch(self, batch: list[tuple[Plan, _Slot]]) -> None:
        try:
            results = await self.state.execute_many([plan for plan, _ in batch])
        except Exception as exc:  # a bug costs this batch's calls, not the server
            log.exception("an HTTP batch failed", extra={"event": "http.batch_crashed"})
            results = [InternalError(f"the service failed: {type(exc).__name__}")] * len(batch)
        for (_, slot), result in zip(batch, results, strict=True):
            slot.result = result
            slot.done.set()
