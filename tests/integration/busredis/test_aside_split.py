"""A full target's trigger set aside on a split bus (0060, 0067): positions stored in rounds,
marks at once. The other trigger of the partition is served in order; the set-aside one,
once served, gets each of its events once, in order, its stream held at the backlog meanwhile."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_stream
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.integration.handlers import Handler
from tests.integration.reactive.test_aside import (
    BACKLOG,
    WRITES,
    keys_of,
    marks,
    register,
    runs,
    scopes_in_one_partition,
)

pytestmark = pytest.mark.anyio


async def test_a_dead_target_holds_up_only_its_own_trigger_on_a_split_bus(
        pair: Pair, prefix: str, scope: str) -> None:
    settings = pair.settings(prefix, trigger_backlog=BACKLOG)
    scopes = scopes_in_one_partition(prefix, scope, 2)
    state_raw, bus_raw = aredis.Redis(port=pair.state.port), aredis.Redis(port=pair.bus.port)
    try:
        async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
                StateStore.open(pair.state.url, prefix=prefix, partitions=4,
                                reaper=False) as store, \
                Handler(settings).running() as theirs:
            assert service.dispatcher is not None
            await register(store, "a", "dead", scopes[0])
            await register(store, "b", "reactor", scopes[1])
            await until(lambda: service.dispatcher.triggers.ids == {"a", "b"}, 10, "triggers")
            for n in range(WRITES):
                await store.set(scopes[0], f"k{n:02}", n)
                await store.set(scopes[1], f"k{n:02}", n)
            await until(lambda: len(theirs.calls) == WRITES, 30, "b served every event")
            assert await bus_raw.xlen(bus_stream(prefix, "dead")) == BACKLOG
            async with Handler(settings, service="dead").running() as mine:
                await until(lambda: len(mine.calls) == WRITES, 30, "a caught up")

                async def rejoined() -> bool:
                    return not await marks(state_raw, prefix, scopes[0])

                await until(rejoined, 30, "a's mark dropped")
            wanted = [f"k{n:02}" for n in range(WRITES)]
            assert keys_of(mine) == wanted and keys_of(theirs) == wanted
            assert set(runs(mine).values()) == {1} and set(runs(theirs).values()) == {1}
    finally:
        await state_raw.aclose()
        await bus_raw.aclose()
