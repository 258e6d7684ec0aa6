"""state::barrier over the bus with two state service replicas on one Redis and prefix: 200
concurrent arrivals allow exactly once, with all 200 results, and a retried completing call
gets its `allow` again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ARRIVALS = 200
CLIENTS = 4


@asynccontextmanager
async def replicas(settings: Settings) -> AsyncIterator[list[StateService]]:
    """Two state services on the same Redis and prefix (one consumer group, two consumers);
    small reads, so each takes its share of a burst."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(StateService.running(
            settings, BusOptions(block_ms=50, read_count=4, consumer=f"replica-{name}")))
            for name in ("a", "b")]


@pytest.mark.parametrize("named", [False, True])
async def test_200_concurrent_arrivals_across_two_replicas_allow_exactly_once(
        redis_server: RedisServer, prefix: str, named: bool) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    bid, keys = f"fan-in-{uuid.uuid4().hex[:8]}", [f"producer-{i:03d}" for i in range(ARRIVALS)]
    config = {"id": bid, "expect": keys if named else ARRIVALS, "carry": "/new_value"}
    replies: list[dict[str, Any]] = []

    async with replicas(settings) as services, AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(StateClient(settings=settings, timeout=30))
                   for _ in range(CLIENTS)]

        async def arrive(i: int) -> None:
            event = {"key": keys[i], "new_value": {"rows": i, "ok": True}}
            replies.append(await clients[i % CLIENTS].barrier(event, config))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(ARRIVALS):
                    tg.start_soon(arrive, i)
        taken = [service.runtime.stats.total for service in services]
        assert sum(taken) == ARRIVALS and min(taken) > 0, taken  # both replicas took arrivals

    allowed = [r for r in replies if r["decision"] == "allow"]
    assert len(allowed) == 1
    assert allowed[0]["reason"] == f"barrier `{bid}` complete ({ARRIVALS}/{ARRIVALS})"
    assert allowed[0]["payload"] == {
        "results": {key: {"rows": i, "ok": True} for i, key in enumerate(keys)}}
    skips = [r["reason"] for r in replies if r["decision"] == "skip"]
    prefix_text = f"barrier `{bid}`: "
    assert all(reason.startswith(prefix_text) for reason in skips)
    counted = sorted(int(reason[len(prefix_text):].split("/")[0]) for reason in skips)
    assert counted == list(range(1, ARRIVALS))  # every arrival counted once, one at a time


async def test_a_retried_completing_call_gets_the_same_allow(redis_server: RedisServer,
                                                             prefix: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    bid = f"retry-{uuid.uuid4().hex[:8]}"
    config = {"id": bid, "expect": 2, "carry": "/v"}
    async with replicas(settings), StateClient(settings=settings) as client:
        await client.barrier({"key": "a", "v": 1}, config, call_id=f"{bid}-a")
        done = await client.barrier({"key": "b", "v": 2}, config, call_id=f"{bid}-b")
        assert done == {"decision": "allow", "payload": {"results": {"a": 1, "b": 2}},
                        "reason": f"barrier `{bid}` complete (2/2)"}
        assert await client.barrier({"key": "b", "v": 2}, config, call_id=f"{bid}-b") == done
        assert await client.barrier({"key": "b", "v": 2}, config) == {
            "decision": "skip", "reason": f"barrier `{bid}` already complete"}
