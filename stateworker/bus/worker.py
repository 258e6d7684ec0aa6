"""`Worker`: a user's own service on the bus, with the state service's guarantees.

    worker = Worker(service="orders")

    @worker.function("orders::create")
    async def create(body, call):
        return {"created": body["id"]}

    await worker.run()    # or worker.serve() from a script

Replies are recorded by call id (for `dedupe_window_ms`): a call delivered again (a retry,
a redelivery after a crash) gets the recorded reply and the function does not run again.
A crash after the function's side effects but before the reply was written runs it again
(at-least-once) - make such effects idempotent with the call id (`call.id`).
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from stateworker import codec
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.bus.runtime import BusRuntime
from stateworker.errors import InvalidRequest, UnknownFunction
from stateworker.loop import run
from stateworker.settings import Settings
from stateworker.transport.connection import RedisConnection
from stateworker.transport.embedded import socket_url

Function = Callable[[Any, Call], Awaitable[Any]]


class Worker:
    """Serves the functions registered with `@worker.function(name)` on `<prefix>:bus:<service>`."""

    def __init__(self, service: str, redis_url: str | None = None, *,
                 options: BusOptions | None = None, settings: Settings | None = None) -> None:
        self.service = service
        self.settings = settings or Settings.from_env(redis_url=redis_url)
        self.options = options or BusOptions()
        self.functions: dict[str, Function] = {}
        self.runtime: BusRuntime | None = None

    def function(self, name: str | None = None) -> Callable[[Function], Function]:
        """Register an async `fn(body, call)`; its return value (JSON-able) is the result."""
        def register(fn: Function) -> Function:
            self.functions[name or f"{self.service}::{fn.__name__}"] = fn
            return fn

        return register

    async def _handle(self, call: Call) -> bytes:
        fn = self.functions.get(call.fn)
        if fn is None:
            raise UnknownFunction(f"fn: unknown function {call.fn!r}; service {self.service!r} "
                                  f"serves {', '.join(sorted(self.functions))}", {"fn": call.fn})
        try:
            body = codec.decode_value(call.body)
        except ValueError as exc:
            raise InvalidRequest(f"$: the request body is not valid JSON: {exc}",
                                 {"path": "$"}) from exc
        result = await fn(body, call)
        return msgspec.json.encode(codec.to_json_tree(result))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`; calls already read are answered before it returns."""
        url = self.settings.redis_url or socket_url(Path(self.settings.state_dir))
        conn = RedisConnection(url)
        self.runtime = BusRuntime(conn, Bus(self.settings.prefix, self.service), self.options,
                                  handler=self._handle,
                                  record_ttl_ms=self.settings.dedupe_window_ms)
        try:
            await self.runtime.run(task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    def stop(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()

    def serve(self) -> None:
        """Run until SIGINT or SIGTERM (for a worker's own `__main__`)."""
        async def main() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.run)
                    async for _ in signals:
                        self.stop()
                        break

        run(main)
