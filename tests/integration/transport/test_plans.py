"""Redis out of memory (transport/plans.py): a write it refuses is RESOURCE_EXHAUSTED naming
`maxmemory`, with nothing written, while reads go on; a caller on the bus meets it when it
sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aredis

from stateworker import StateClient, StateError, StateStore
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def small_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A server of its own: the test sets maxmemory."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


async def test_out_of_memory_is_resource_exhausted(small_redis: RedisServer) -> None:
    async with StateStore.open(small_redis.url, prefix="oom", partitions=2,
                               reaper=False) as store:
        admin = aredis.Redis(port=small_redis.port)
        value = "x" * 64 * 1024
        await store.set("s", "k0", value)
        # A limit below what Redis already holds: every write is refused, whatever Redis's
        # own buffers do meanwhile (a limit just above the usage made this test depend on
        # them: a write could fit again once they shrank).
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")
        with pytest.raises(StateError) as caught:
            await store.set("s", "k1", value)
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        assert "maxmemory" in caught.value.message and "nothing was written" in \
            caught.value.message
        assert await store.get("s", "k1") is None  # refused before the script ran
        assert await store.get("s", "k0") == value  # reads still work
        with pytest.raises(StateError) as caught:
            await store.call("state::update", {"scope": "s", "key": "k0", "ops": [
                {"type": "set", "path": "", "value": "y"}]})
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        assert await store.get("s", "k0") == value
        # A caller on the bus meets it when it sends: its XADD is refused.
        async with StateClient(settings=Settings(redis_url=small_redis.url, prefix="oom"),
                               timeout=5) as client:
            with pytest.raises(StateError) as caught:
                await client.set("s", "by-bus", 1)
            assert caught.value.code == "RESOURCE_EXHAUSTED"
            assert "maxmemory" in caught.value.message
        await admin.config_set("maxmemory", "0")  # memory back: writes go on
        await store.set("s", "k1", value)
        assert await store.get("s", "k1") == value
        await admin.aclose()
