"""What a runtime reads ahead is bounded in total, not only per caller (bus/lanes.py): a lane
is named by the entry's own `caller` field, so a flood naming a new caller in each entry makes
a lane each; past TOTAL_HELD entries or HELD_BYTES bytes in memory across the lanes, entries
are parked as ids, and every call is still served, each once."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis

from stateworker.bus.lanes import HELD_BYTES, TOTAL_HELD
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio
SLOTS = 8


@pytest.mark.parametrize(("entries", "pad"), [(TOTAL_HELD + 900, 10),  # the count bound
                                              (HELD_BYTES // 65_536 + 100, 65_536)])  # bytes
async def test_a_flood_of_distinct_callers_is_parked_past_the_total_bounds(
        redis_server: RedisServer, prefix: str, entries: int, pad: int) -> None:
    raw = aredis.Redis(port=redis_server.port)
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    worker = Worker("slow", settings=settings,
                    options=BusOptions(block_ms=50, concurrency=SLOTS))
    release = anyio.Event()
    served: list[str] = []

    @worker.function("slow::work")
    async def work(body: Any, call: Call) -> Any:
        served.append(call.id or "")
        await release.wait()  # (a handler waiting on something downstream)
        return None

    stream = f"{prefix}:bus:slow"
    body = b'{"pad":"' + b"x" * pad + b'"}'
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            async with raw.pipeline(transaction=False) as pipe:
                for i in range(entries):  # every entry names another caller
                    pipe.xadd(stream, {"id": uuid.uuid4().hex, "fn": "slow::work",
                                       "body": body, "reply": "", "caller": f"c{i}"})
                await pipe.execute()
            lanes = worker.runtime.lanes
            await until(lambda: len(served) == SLOTS
                        and lanes.held + lanes.parked == entries - SLOTS, 60,
                        "the whole flood read (held or parked)")
            held_bytes = sum(len(f) for lane in lanes.lanes.values() for e in lane.held
                             for f in e.flat or ())
            assert lanes.held <= TOTAL_HELD and held_bytes <= HELD_BYTES
            assert held_bytes == lanes.held_bytes and lanes.parked > 0
            release.set()
            await until(lambda: len(served) == entries, 120, "every call served")
            assert len(set(served)) == entries  # each once

            async def drained() -> bool:
                groups = await raw.xinfo_groups(stream)
                return bool(groups[0]["pending"] == 0)

            await until(drained, 30, "every call acknowledged")
            worker.stop()
    finally:
        await raw.aclose()
