"""The dispatcher's clients of condition services (reactive/conditions.py): triggers naming
many condition services cost each replica at most 2 x MAX_CLIENTS Redis connections, not two
per service for as long as it runs, and a reload of the triggers closes the clients of the
services no trigger names any more. Counted with Redis's own INFO clients."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.reactive.conditions import MAX_CLIENTS
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio
SERVICES = MAX_CLIENTS + 8


async def test_condition_clients_are_bounded_and_closed_when_no_trigger_names_them(
        own_redis: RedisServer, prefix: str, scope: str) -> None:
    raw = aredis.Redis(host="127.0.0.1", port=own_redis.port)
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4)

    async def connected() -> int:
        clients: int = (await raw.info("clients"))["connected_clients"]
        return clients

    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
        assert service.dispatcher is not None
        dispatcher = service.dispatcher
        for i in range(SERVICES):  # each names a condition service of its own, none answers
            await store.call("state::register-trigger", {
                "id": f"t{i}", "function_id": "h::f", "service": "h", "config": {
                    "scope": scope, "condition_function_id": f"c{i}::f",
                    "condition_service": f"c{i}", "condition_timeout_ms": 1}})
        await until(lambda: len(dispatcher.triggers.ids) == SERVICES, 10, "the triggers loaded")
        before = await connected()
        await store.set(scope, "k", 1)

        async def failed() -> bool:
            await dispatcher.counts.flush()
            stats = await raw.hgetall(service.state.keys.dispatch_stats)
            return stats.get(b"condition_errors") == str(SERVICES).encode()
        await until(failed, 30, "every condition timed out")
        async def bounded() -> bool:
            return await connected() - before <= 2 * MAX_CLIENTS
        await until(bounded, 10,
                    f"at most {2 * MAX_CLIENTS} connections of condition clients")

        for i in range(SERVICES):
            await store.call("state::unregister-trigger", {"id": f"t{i}"})

        async def closed() -> bool:
            return await connected() <= before
        await until(closed, 10, "the condition clients closed once no trigger names them")
    await raw.aclose()
