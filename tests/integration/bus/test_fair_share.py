"""A fair share of the shared call stream: one caller's flood does not stand ahead of another
caller's next call (bus/lanes.py), and every flooded call is still served, each once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_stream
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

FLOOD = 20_000


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aredis.Redis]:
    conn = aredis.Redis.from_url(redis_server.url)
    yield conn
    await conn.aclose()


async def test_a_flood_of_one_caller_does_not_starve_another(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    stream = bus_stream(prefix, "state")
    # Four calls in flight: the flood takes every slot at once.
    async with StateService.running(settings, BusOptions(block_ms=50, concurrency=4)), \
            StateClient(settings=settings, caller="probe") as probe:
        async with raw.pipeline(transaction=False) as pipe:
            for n in range(FLOOD):  # fire-and-forget sets, all of them ahead of the probe
                pipe.xadd(stream, {"id": f"flood-{n}", "fn": "state::set", "reply": "",
                                   "caller": "flood", "body": msgspec.json.encode(
                                       {"scope": scope, "key": f"k{n}", "value": n})})
            await pipe.execute()
        await probe.set(f"{scope}-probe", "k", 1)
        # Answered while most of the flood still waits (in one queue, after all of it).
        left = await raw.xlen(stream)
        assert left > FLOOD // 4, f"the probe waited for {FLOOD - left} flooded calls"

        async def drained() -> bool:
            groups = await raw.xinfo_groups(stream)
            return await raw.xlen(stream) == 0 and groups[0]["pending"] == 0

        await until(drained, 120, "every flooded call served")
        assert len(await probe.list_keys(scope)) == FLOOD
        assert await probe.get(scope, f"k{FLOOD - 1}") == FLOOD - 1
