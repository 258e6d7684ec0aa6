"""With the bus on a Redis of its own (decision 0056), the dead consumers of its streams are
removed there: the sweep's script is loaded on the bus's Redis (a library of the bus's one
script; the state's is not there), by the state service and by a user worker alike."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.keys import bus_stream
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

SWEEPING = {"block_ms": 50, "visibility_timeout_ms": 1000, "dead_consumer_ms": 0}


def consumers(server: RedisServer, stream: str, group: str) -> dict[str, int]:
    with server.client() as raw:
        return {c["name"].decode(): c["pending"] for c in raw.xinfo_consumers(stream, group)}


def functions(server: RedisServer) -> list[list[str]]:
    """Each library's function names on `server`."""
    def pairs(flat: list[Any]) -> dict[str, Any]:
        return {key.decode(): value for key, value in zip(flat[::2], flat[1::2], strict=True)}

    with server.client() as raw:
        return sorted(sorted(pairs(f)["name"].decode().rsplit("_", 1)[-1]
                             for f in pairs(library)["functions"])
                      for library in raw.function_list())


async def test_the_bus_redis_gets_the_sweep_and_loses_its_dead_consumers(
        pair: Pair, prefix: str, scope: str) -> None:
    settings = pair.settings(prefix)
    state_stream, worker_stream = bus_stream(prefix, "state"), bus_stream(prefix, "svc")
    worker = Worker("svc", settings=settings, options=BusOptions(consumer="svc-live",
                                                                 **SWEEPING))

    @worker.function("svc::ping")
    async def ping(body: Any, call: Call) -> str:
        return "pong"

    async with StateService.running(settings, BusOptions(**SWEEPING)) as service, \
            StateClient(settings=settings, timeout=5) as client, \
            anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with pair.bus.client() as raw:
            for stream, group in ((state_stream, "state"), (worker_stream, "svc")):
                for n in range(3):
                    raw.execute_command("XGROUP", "CREATECONSUMER", stream, group, f"gone-{n}")
        live = {state_stream: ({service.runtime.consumer: 0}, "state"),
                worker_stream: ({"svc-live": 0}, "svc")}
        await until(lambda: all(consumers(pair.bus, stream, group) == left
                                for stream, (left, group) in live.items()), 20,
                    "the dead consumers of both streams removed")
        await client.set(scope, "k", 1)
        assert await client.get(scope, "k") == 1
        async with StateClient(settings=settings, service="svc", timeout=5) as caller:
            assert await caller.call("svc::ping", {}) == "pong"
        worker.stop()
    # The bus Redis holds the bus's library alone (the sweep, and the dispatcher's removal
    # of target streams: reactive/targets.py); the state's Redis the state's (whose
    # functions include both too, never called there).
    assert functions(pair.bus) == [["droptarget", "sweep"]]
    (state_library,) = functions(pair.state)
    assert "set" in state_library

