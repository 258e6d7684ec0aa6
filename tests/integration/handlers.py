"""A trigger's handler for the tests: a Worker service that records the calls it gets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from stateworker import Worker
from stateworker.bus.protocol import BusOptions, Call
from stateworker.settings import Settings


class Handler:
    """A Worker service that records every call it gets: (call id, body)."""

    def __init__(self, settings: Settings, service: str = "reactor") -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.worker = Worker(service, settings=settings, options=BusOptions(block_ms=50))

        @self.worker.function(f"{service}::on_change")
        async def on_change(body: dict[str, Any], call: Call) -> None:
            self.calls.append((call.id or "", body))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Handler]:
        async with anyio.create_task_group() as tg:
            await tg.start(self.worker.run)
            try:
                yield self
            finally:
                self.worker.stop()

    def delivered_keys(self) -> list[str]:
        return [body["key"] for _, body in self.calls]


class Gate(Handler):
    """A condition service (`checker::gate`) that answers only when the test releases it:
    `asked` is set at each question, `answered` lists the keys it answered for."""

    def __init__(self, settings: Settings, answer: bool, service: str = "checker") -> None:
        super().__init__(settings, service=service)
        self.release, self.asked = anyio.Event(), anyio.Event()
        self.answered: list[str] = []

        @self.worker.function(f"{service}::gate")
        async def gate(body: dict[str, Any], call: Call) -> bool:
            self.asked.set()
            await self.release.wait()  # answers only when the test says so
            self.answered.append(body["key"])
            return answer
