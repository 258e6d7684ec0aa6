"""The sweep of dead consumers (sweep.lua, decision 0068) on one server and on the 3+3
cluster: a 3-shard service's streams sit in different slots, each swept by its own script
(the stream its one key), the bus's library loaded on every primary."""

from __future__ import annotations

import pytest

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_shard_stream
from stateworker.settings import Settings
from stateworker.transport.slots import key_slot
from tests.integration.busproto import until

pytestmark = pytest.mark.anyio


async def test_each_shards_dead_consumers_are_removed(url: str, where: str, prefix: str
                                                      ) -> None:
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, bus_shards=3)
    streams = [bus_shard_stream(prefix, "state", n) for n in range(3)]
    assert len({key_slot(stream) for stream in streams}) == 3
    options = BusOptions(block_ms=50, visibility_timeout_ms=1000, dead_consumer_ms=0)
    async with StateService.running(settings, options) as service:
        conn, mine = service.runtime.conn, service.runtime.consumer
        for stream in streams:
            for n in range(2):
                await conn.execute("XGROUP", "CREATECONSUMER", stream, "state", f"gone-{n}")

        async def names(stream: str) -> set[bytes]:
            found = await conn.execute("XINFO", "CONSUMERS", stream, "state")
            return {dict(zip(c[::2], c[1::2], strict=True))[b"name"] for c in found}

        async def swept() -> bool:
            return [await names(stream) for stream in streams] == [{mine.encode()}] * 3

        await until(swept, 20, f"every shard's dead consumers removed ({where})")
