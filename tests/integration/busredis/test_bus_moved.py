"""The bus moved at a restart (STATEWORKER_BUS_REDIS_URL set, unset; fewer shards) while a
trigger call waits unserved where it was: the start is refused (LAYOUT_MISMATCH naming the
setting, where the bus was, where it is now, and the calls waiting), and once they are served
there the move goes and every event is delivered once (decision 0076).

Found by attack: a trigger's call handed on while the bus was on the state's Redis (its
worker down), the services and the worker restarted with the bus on a Redis of its own (and
the other way round): the service started, the new events were delivered, and the one
handed on before never was, without a word."""

from __future__ import annotations

import msgspec
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import LayoutMismatch
from stateworker.keys import bus_shard_stream
from stateworker.settings import Settings
from stateworker.state.layout import BUS_FIELD
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.integration.handlers import Handler
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def hand_on_unserved(settings: Settings, bus: RedisServer, scope: str,
                           shard: int = 0) -> None:
    """A service with `settings` hands a trigger call on to `reactor` (the shard of the
    scope's partition), which no worker serves; then it stops."""
    stream = bus_shard_stream(settings.prefix, "reactor", shard)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings, reaper=False) as store:
        await store.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await store.set(scope, "k1", 1)
        await until(lambda: bus.client().xlen(stream) == 1, 30, "the call handed on")


async def refused(settings: Settings) -> LayoutMismatch:
    with pytest.raises(LayoutMismatch) as caught:
        async with StateService.running(settings, BusOptions(block_ms=50)):
            pass
    assert caught.value.code == "LAYOUT_MISMATCH"
    return caught.value


async def delivered(settings: Settings, scope: str, key: str | None) -> list[str]:
    """A service and the worker with `settings`; `key` written (None: nothing) and every
    delivery until it came. The keys delivered."""
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            Handler(settings).running() as handler, \
            StateClient(settings=settings, timeout=10) as client:
        if key is not None:
            await client.set(scope, key, 2)
        wanted = key or "k1"
        await until(lambda: wanted in handler.delivered_keys(), 30, f"{wanted} delivered")
        return handler.delivered_keys()


@pytest.mark.parametrize("move", ["to_its_own", "back_to_the_state"])
async def test_a_bus_moved_over_an_unserved_call_is_refused_until_it_is_served(
        pair: Pair, prefix: str, scope: str, move: str) -> None:
    split = pair.settings(prefix)
    same = msgspec.structs.replace(split, bus_redis_url=None)
    before, after = (same, split) if move == "to_its_own" else (split, same)
    old_bus = pair.state if before is same else pair.bus
    await hand_on_unserved(before, old_bus, scope)

    exc = await refused(after)
    stream = bus_shard_stream(prefix, "reactor", 0)
    stored = "" if before is same else pair.bus.url
    given = "" if after is same else pair.bus.url
    assert exc.details == {"setting": "bus_redis_url", "stored": stored, "given": given,
                           "prefix": prefix, "unserved": {stream: 1}}
    assert "STATEWORKER_BUS_REDIS_URL" in exc.message and stream in exc.message
    # Served where it was, then moved: each event delivered once.
    assert await delivered(before, scope, None) == ["k1"]
    assert await delivered(after, scope, "k2") == ["k2"]


async def test_a_bus_that_cannot_be_reached_is_refused_until_its_record_is_dropped(
        pair: Pair, prefix: str, scope: str) -> None:
    split = pair.settings(prefix)
    await hand_on_unserved(split, pair.bus, scope)
    pair.bus.kill()
    same = msgspec.structs.replace(split, bus_redis_url=None)
    exc = await refused(same)
    assert exc.details["setting"] == "bus_redis_url" and exc.details["stored"] == pair.bus.url
    assert "cannot be reached" in exc.message
    hdel = f"HDEL {prefix}:serving {BUS_FIELD}"
    assert hdel in exc.message
    pair.state.client().execute_command(*hdel.split())  # (that Redis is gone: dropped)
    assert await delivered(same, scope, "k2") == ["k2"]


async def test_the_same_bus_by_another_url_is_no_move(pair: Pair, prefix: str,
                                                      scope: str) -> None:
    """The bus Redis named by another URL (no database: 0): its run id and database are the
    old one's, so the call waiting there is the new settings' to serve; another database of
    the same server is another bus."""
    split = pair.settings(prefix)
    await hand_on_unserved(split, pair.bus, scope)
    # (another database of that server is another bus: refused)
    database = msgspec.structs.replace(
        split, bus_redis_url=f"redis://127.0.0.1:{pair.bus.port}/1")
    assert (await refused(database)).details["setting"] == "bus_redis_url"
    other = msgspec.structs.replace(
        split, bus_redis_url=f"redis://127.0.0.1:{pair.bus.port}")
    assert await delivered(other, scope, "k2") == ["k1", "k2"]


async def test_fewer_shards_over_an_unserved_call_are_refused(
        redis_server: RedisServer, prefix: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4, bus_shards=4)
    keys_of: dict[int, str] = {}
    async with StateStore.open(settings=settings, reaper=False) as store:
        for n in range(40):  # (a scope of each partition: its calls go to that shard)
            keys_of.setdefault(store.state.keys.partition_of(f"s{n}"), f"s{n}")
    scope = keys_of[3]
    await hand_on_unserved(settings, redis_server, scope, shard=3)
    stream = bus_shard_stream(prefix, "reactor", 3)
    fewer = msgspec.structs.replace(settings, bus_shards=2)
    exc = await refused(fewer)
    assert exc.details == {"setting": "bus_shards", "stored": "4", "given": "2",
                           "prefix": prefix, "unserved": {stream: 1}}
    assert "STATEWORKER_BUS_SHARDS=4" in exc.message
    assert await delivered(settings, scope, None) == ["k1"]
    assert await delivered(fewer, scope, "k2") == ["k2"]


async def test_a_service_beside_a_live_one_on_another_bus_is_refused(
        pair: Pair, prefix: str) -> None:
    """A live service with the bus on a Redis of its own: one with the bus on the state's
    Redis is refused (trigger calls of half the partitions would go where the other's workers
    never read); one naming the same bus Redis by another URL joins it."""
    split = pair.settings(prefix)
    async with StateService.running(split, BusOptions(block_ms=50)) as live:
        exc = await refused(msgspec.structs.replace(split, bus_redis_url=None))
        assert exc.details == {"setting": "bus_redis_url", "stored": pair.bus.url, "given": "",
                               "prefix": prefix, "consumer": live.runtime.consumer}
        same = msgspec.structs.replace(split, bus_redis_url=f"redis://127.0.0.1:{pair.bus.port}")
        async with StateService.running(same, BusOptions(block_ms=50)):
            pass
