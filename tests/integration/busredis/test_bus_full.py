"""The bus's Redis out of memory (maxmemory, policy noeviction) while the state's Redis takes
writes: the dispatcher's handler calls are refused there, and the events behind them are
handed on once memory is freed, not passed over."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.integration.handlers import Handler
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def refused_for_memory(server: RedisServer) -> int:
    """How many commands the server refused as out of memory (INFO errorstats)."""
    return int(server.client().info("errorstats").get("errorstat_OOM", {}).get("count", 0))


async def test_trigger_calls_refused_by_a_full_bus_are_handed_on_once_it_has_room(
        pair: Pair, prefix: str, scope: str) -> None:
    settings = pair.settings(prefix)
    bus = pair.bus.client()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(pair.state.url, prefix=prefix, partitions=4,
                            reaper=False, durability="strict") as store:
        await store.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        # A flood filled the bus's Redis: it refuses every XADD from now on.
        bus.config_set("maxmemory-policy", "noeviction")
        bus.config_set("maxmemory", 1)
        keys = [f"k{n}" for n in range(10)]
        for key in keys:  # (the state's Redis has room: each write is acknowledged)
            await store.set(scope, key, 1)
        # Every event's handler call was refused once at least (10 XADDs).
        await until(lambda: refused_for_memory(pair.bus) >= len(keys), 30,
                    "the handler calls refused by the full bus")
        bus.config_set("maxmemory", 0)  # the flood's keys deleted: room again
        async with Handler(settings).running() as handler:
            await until(lambda: len(handler.calls) >= len(keys), 30,
                        "every acknowledged write's handler call")
        assert sorted(handler.delivered_keys()) == keys  # each once (the worker's records)
