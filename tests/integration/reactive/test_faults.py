"""The dispatcher under faults: a replica killed mid-dispatch, a dispatcher stopped while
more events than the retention window are written, and the hard cap cutting events."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis

from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio


def rev(revision: str) -> tuple[int, int]:
    ms, seq = revision.split("-")
    return int(ms), int(seq)


async def register(store: StateStore, trigger_id: str, service: str = "reactor") -> None:
    await store.call("state::register-trigger", {
        "id": trigger_id, "function_id": f"{service}::on_change", "service": service})


async def test_kill_9_of_a_replica_mid_dispatch_loses_and_reorders_nothing(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    env = {"STATEWORKER_LEASE_MS": "1000"}
    replicas = [ServiceProcess(redis_server.url, prefix, consumer=f"r{i}", env=env)
                for i in range(2)]
    for replica in replicas:
        replica.start()
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    ran: dict[str, int] = defaultdict(int)  # call id -> handler runs
    first_runs: dict[str, list[tuple[int, int]]] = defaultdict(list)  # scope -> revisions
    # One call at a time: the handler runs in the order the calls were appended.
    worker = Worker("reactor", settings=settings,
                    options=BusOptions(block_ms=50, concurrency=1))

    @worker.function("reactor::on_change")
    async def on_change(body: dict[str, Any], call: Call) -> None:
        call_id = call.id or ""
        assert call_id.startswith("all:p") and call_id.endswith(f":{body['revision']}")
        if not ran[call_id]:
            first_runs[body["scope"]].append(rev(body["revision"]))
        ran[call_id] += 1

    scopes = [f"{scope}-{i}" for i in range(8)]
    try:
        async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                                   reaper=False) as store, anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await register(store, "all")
            # Both replicas dispatch before the writes start.
            await until(lambda: _holders(raw, prefix), 30, "leases on both replicas")

            async def write(name: str) -> None:
                for n in range(125):
                    await store.set(name, "k", n)

            async with anyio.create_task_group() as writers:
                for name in scopes:
                    writers.start_soon(write, name)
                await until(lambda: len(ran) >= 250, 20, "a quarter handed on")
                replicas[0].kill()
                at_kill = len(ran)
            assert at_kill < 1000, "the kill came after the last delivery: nothing in flight"
            replicas[0].start()
            await until(lambda: len(ran) == 1000, 30, "every event's handler")
            worker.stop()
        assert len(ran) == 1000 and sorted(first_runs) == sorted(scopes)
        for name in scopes:
            assert first_runs[name] == sorted(first_runs[name]) and len(first_runs[name]) == 125
        assert set(ran.values()) == {1}, "a handler ran twice for one event"
    finally:
        for replica in replicas:
            replica.kill()


async def _holders(raw: aredis.Redis, prefix: str) -> bool:
    holders = {await raw.get(f"{prefix}:{{{prefix}:p{n}}}:lease") for n in range(4)}
    return None not in holders and len(holders) == 2


async def test_a_stopped_dispatcher_loses_nothing_beyond_the_retention_window(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    # (No worker serves the target: its backlog must hold every call, test_backlog.py has
    # the bound itself.)
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        events_retain=0, trigger_backlog=100_000)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        assert service.dispatcher is not None
        await register(StateStore(service.state), "all")
        await until(lambda: len(service.dispatcher.positions) == 4, 10, "positions")
    # Stopped. 50,000 events, far past a retention window of 0 s.
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store, anyio.create_task_group() as tg:
        for w in range(20):
            tg.start_soon(_write_many, store, f"{scope}-{w}", 2500)
    stopped = (await status_report(settings))["dispatch"]
    assert sum(p["lag_events"] for p in stopped["partitions"]) == 50_000
    assert all(p["lag_ms"] > 0 for p in stopped["partitions"])
    assert stopped["triggers"] == 1 and stopped["replicas"] == {}
    async with StateService.running(settings, BusOptions(block_ms=50)):
        async def all_handed_on() -> bool:
            return int(await raw.xlen(f"{prefix}:bus:reactor")) >= 50_000
        await until(all_handed_on, 120, "50,000 handler calls")
        # Trimmed down to what was not yet dispatched (0 s retention) within a round.
        async def trimmed() -> bool:
            lengths = [await raw.xlen(f"{prefix}:{{{prefix}:p{n}}}:events") for n in range(4)]
            return sum(lengths) < 5_000
        await until(trimmed, 10, "the dispatched events trimmed")
    ids = {fields[b"id"] for _, fields in await raw.xrange(f"{prefix}:bus:reactor")}
    assert len(ids) == 50_000
    for n in range(4):
        assert not await raw.exists(f"{prefix}:{{{prefix}:p{n}}}:cut")


async def _write_many(store: StateStore, name: str, count: int) -> None:
    for n in range(count):
        await store.set(name, "k", n)


async def test_events_the_hard_cap_cuts_before_dispatch_are_reported(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=1,
                        events_maxlen=100)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        await register(StateStore(service.state), "all")
        assert service.dispatcher is not None
        await until(lambda: len(service.dispatcher.positions) == 1, 10, "a position")
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=1,
                               events_maxlen=100, reaper=False) as store:
        await _write_many(store, scope, 1000)
    info = await raw.xinfo_stream(f"{prefix}:{{{prefix}:p0}}:events")
    cut = info["entries-added"] - info["length"]
    assert cut > 0
    async with StateService.running(settings, BusOptions(block_ms=50)):
        async def dispatched() -> bool:
            return int(await raw.xlen(f"{prefix}:bus:reactor")) >= 1000 - cut
        await until(dispatched, 20, "the events still kept, handed on")
        async def reported() -> bool:
            return await raw.hget(f"{prefix}:{{{prefix}:p0}}:cut", "events") is not None
        await until(reported, 10, "the cut reported")
    assert int(await raw.hget(f"{prefix}:{{{prefix}:p0}}:cut", "events")) == cut
    (shown,) = (await status_report(settings))["dispatch"]["partitions"]
    assert shown["cut_events"] == cut and shown["lag_events"] == 0
    assert await raw.xlen(f"{prefix}:bus:reactor") == 1000 - cut
