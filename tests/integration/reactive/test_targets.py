"""The streams of trigger targets no trigger names any more are removed (reactive/targets.py).

A registration makes its target's stream and group; a caller registering triggers with a
fresh `service` each time left ~700 bytes a name for good. The dispatcher's sweep removes a
stream no loaded trigger has named at two sweeps in a row, when it holds no call and no
consumer: calls waiting for a worker that may still come are kept, and so is a stream a
worker serves."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, bus_shard_stream, bus_stream
from stateworker.reactive.targets import Targets
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.reactive.test_aside import register
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

FLOOD = 30


async def test_a_flood_of_fresh_targets_leaves_no_stream_behind(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """Registered and unregistered faster than the dispatcher loads them, each with a fresh
    service: every stream and every name in the set is gone after the sweeps; the target a
    trigger still names keeps its stream."""
    settings = settings_for(redis_server, prefix, bus_shards=2)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                            reaper=False, bus_shards=2) as store:
        assert service.dispatcher is not None
        service.dispatcher.targets.sweep_s = 0.0  # (a sweep every round: ROUND_S)
        for n in range(FLOOD):
            await register(store, f"t{n}", f"fresh{n}", scope)
            await store.call("state::unregister-trigger", {"id": f"t{n}"})
        await register(store, "kept", "named", scope)
        streams = [bus_shard_stream(prefix, f"fresh{n}", shard)
                   for n in range(FLOOD) for shard in range(2)]
        assert await raw.exists(*streams) == 2 * FLOOD  # (what the flood left)

        async def gone() -> bool:
            return await raw.exists(*streams) == 0

        await until(gone, 15, "the flood's streams removed")
        targets = KeySpace(prefix, 4).dispatch_targets
        assert await raw.smembers(targets) == {b"named"}
        assert await raw.exists(bus_stream(prefix, "named")) == 1
        assert service.dispatcher.targets.removed == FLOOD


async def test_calls_waiting_for_a_worker_are_kept_until_it_comes(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """A trigger's calls handed on to a service nobody serves yet stay after the trigger is
    gone, however many sweeps pass: the worker that starts later gets each of them once."""
    settings = settings_for(redis_server, prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                            reaper=False) as store:
        assert service.dispatcher is not None
        await register(store, "late", "later", scope)
        await until(lambda: "late" in service.dispatcher.triggers.ids, 10, "trigger loaded")
        for n in range(3):
            await store.set(scope, f"k{n}", n)
        stream = bus_stream(prefix, "later")

        async def handed_on() -> bool:
            return await raw.xlen(stream) == 3

        await until(handed_on, 10, "three calls handed on")
        await store.call("state::unregister-trigger", {"id": "late"})
        await until(lambda: not service.dispatcher.triggers.ids, 10, "trigger gone")
        sweeper = Targets(service.state, sweep_s=0.0)
        assert [await sweeper.sweep([]) for _ in range(3)] == [0, 0, 0]
        assert await raw.xlen(stream) == 3
        async with Handler(settings, service="later").running() as handler:
            await until(lambda: len(handler.calls) == 3, 10, "the late worker served them")
        assert sorted(body["key"] for _, body in handler.calls) == ["k0", "k1", "k2"]


async def test_a_stream_a_worker_serves_is_kept(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """Empty, and named by no trigger, but a worker reads it: kept, and the worker goes on
    getting the calls of a trigger registered again."""
    settings = settings_for(redis_server, prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                            reaper=False) as store, \
            Handler(settings, service="served").running() as handler:
        assert service.dispatcher is not None
        await register(store, "once", "served", scope)
        await store.call("state::unregister-trigger", {"id": "once"})
        sweeper = Targets(service.state, sweep_s=0.0)
        assert [await sweeper.sweep([]) for _ in range(2)] == [0, 0]
        assert await raw.exists(bus_stream(prefix, "served")) == 1
        await register(store, "again", "served", scope)
        await until(lambda: "again" in service.dispatcher.triggers.ids, 10, "trigger loaded")
        await store.set(scope, "k", 1)
        await until(lambda: len(handler.calls) == 1, 10, "the worker served the call")


async def test_a_name_is_removed_only_once_unnamed_at_two_sweeps(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """A registration the dispatcher has not loaded yet looks unnamed: its stream is kept at
    the first sweep that finds it unnamed, removed at the second."""
    settings = settings_for(redis_server, prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                            reaper=False) as store:
        await register(store, "new", "young", scope)
        stream = bus_stream(prefix, "young")
        sweeper = Targets(service.state, sweep_s=0.0)
        assert await sweeper.sweep([]) == 0
        assert await raw.exists(stream) == 1
        assert await sweeper.sweep([]) == 1
        assert await raw.exists(stream) == 0
