"""The streams of trigger targets no trigger names are removed on a split bus too
(reactive/targets.py): there the dispatcher makes the targets' groups on the bus's Redis as it
loads the triggers, and the sweep's script runs on that Redis (its function library loaded
there at the first sweep)."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, bus_stream
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.integration.reactive.test_aside import register

pytestmark = pytest.mark.anyio

FLOOD = 20


async def test_fresh_targets_leave_no_stream_on_the_bus_redis(
        pair: Pair, prefix: str, scope: str) -> None:
    settings = pair.settings(prefix)
    bus_raw = aredis.Redis(port=pair.bus.port)
    try:
        async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
                StateStore.open(pair.state.url, prefix=prefix, partitions=4,
                                reaper=False) as store:
            assert service.dispatcher is not None
            service.dispatcher.targets.sweep_s = 0.0  # (a sweep every round)
            for n in range(FLOOD):
                await register(store, f"t{n}", f"fresh{n}", scope)
                await until(lambda n=n: f"t{n}" in service.dispatcher.triggers.ids, 10,
                            "the trigger loaded (its group made on the bus's Redis)")
                await store.call("state::unregister-trigger", {"id": f"t{n}"})
            await register(store, "kept", "named", scope)
            streams = [bus_stream(prefix, f"fresh{n}") for n in range(FLOOD)]
            targets = KeySpace(prefix, 4).dispatch_targets

            async def gone() -> bool:
                return await bus_raw.exists(*streams) == 0 and \
                    await bus_raw.smembers(targets) == {b"named"}

            await until(gone, 15, "the streams removed from the bus's Redis")
            assert await bus_raw.exists(bus_stream(prefix, "named")) == 1
    finally:
        await bus_raw.aclose()
