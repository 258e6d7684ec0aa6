"""A fair share of the shared call stream: one caller's flood does not stand ahead of another
caller's next call (bus/lanes.py), and every flooded call is still served, each once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.console import Tails
from stateworker.app.http_admission import Admission
from stateworker.app.metrics import Metrics
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_stream
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

FLOOD = 20_000


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aredis.Redis]:
    conn = aredis.Redis.from_url(redis_server.url)
    yield conn
    await conn.aclose()


async def flood(raw: aredis.Redis, stream: str, scope: str) -> None:
    async with raw.pipeline(transaction=False) as pipe:
        for n in range(FLOOD):  # fire-and-forget sets, all of them ahead of the probe
            pipe.xadd(stream, {"id": f"flood-{n}", "fn": "state::set", "reply": "",
                               "caller": "flood", "body": msgspec.json.encode(
                                   {"scope": scope, "key": f"k{n}", "value": n})})
        await pipe.execute()


async def served(raw: aredis.Redis, probe: StateClient, stream: str, scope: str,
                 service: StateService | None = None) -> None:
    """The probe answered while most of the flood still waits (in one queue, after all of
    it), and then every flooded call served."""
    await probe.set(f"{scope}-probe", "k", 1)
    left = await raw.xlen(stream)
    assert left > FLOOD // 4, f"the probe waited for {FLOOD - left} flooded calls"
    if service is not None:  # what waits read ahead shows in /metrics
        metrics = Metrics(service.state, service.runtime, Tails(service.state.settings),
                          Admission(1, 1, 1))
        text = (await metrics.exposition())[0].decode()
        ahead = float(text.split("\nstateworker_bus_read_ahead ")[1].split()[0])
        assert 0 < ahead <= left
        assert "\nstateworker_bus_callers_waiting 1.0\n" in text  # the flood's lane alone

    async def drained() -> bool:
        groups = await raw.xinfo_groups(stream)
        return await raw.xlen(stream) == 0 and groups[0]["pending"] == 0

    await until(drained, 120, "every flooded call served")
    assert len(await probe.list_keys(scope)) == FLOOD
    assert await probe.get(scope, f"k{FLOOD - 1}") == FLOOD - 1


async def test_a_flood_of_one_caller_does_not_starve_another_as_it_serves(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    # The service's defaults (1,024 calls in flight), in a process of its own: it serves as
    # fast as it reads, so its slots never fill, and the flood waits in the stream.
    settings = settings_for(redis_server, prefix)
    stream = bus_stream(prefix, "state")
    service = ServiceProcess(redis_server.url, prefix)
    service.start()
    try:
        async with StateClient(settings=settings, caller="probe") as probe:
            await flood(raw, stream, scope)
            await served(raw, probe, stream, scope)
    finally:
        service.kill()


async def test_a_flood_of_one_caller_does_not_starve_another(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    stream = bus_stream(prefix, "state")
    # Four calls in flight: the flood takes every slot at once.
    async with StateService.running(settings, BusOptions(block_ms=50, concurrency=4)) as service, \
            StateClient(settings=settings, caller="probe") as probe:
        await flood(raw, stream, scope)
        await served(raw, probe, stream, scope, service)
