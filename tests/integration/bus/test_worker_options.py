"""Per-function options of a user's Worker (`@worker.function(name, timeout=...)`), against a
real redis-server: a run longer than its timeout is cancelled and answered with
DEADLINE_EXCEEDED; functions without a timeout, or finishing in time, answer normally."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.errors import DeadlineExceeded, StateError
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_run_longer_than_its_timeout_is_cancelled_and_answered(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    worker = Worker("opts", settings=settings, options=BusOptions(block_ms=50))
    never = anyio.Event()  # never set: only the timeout ends a run of `stuck`
    stuck_runs: list[str | None] = []
    stuck_cancelled = anyio.Event()
    plain_started, plain_release = anyio.Event(), anyio.Event()

    @worker.function("opts::stuck", timeout=0.3)
    async def stuck(body: Any, call: Call) -> Any:
        stuck_runs.append(call.id)
        try:
            await never.wait()
        except anyio.get_cancelled_exc_class():
            stuck_cancelled.set()
            raise
        return {"finished": True}

    @worker.function("opts::plain")  # no timeout: runs as long as it takes
    async def plain(body: Any, call: Call) -> Any:
        plain_started.set()
        await plain_release.wait()
        return {"plain": body["n"]}

    @worker.function(timeout=5.0)  # default name opts::quick, done well in time
    async def quick(body: Any, call: Call) -> Any:
        await checkpoint()
        return {"quick": body["n"]}

    plain_result: list[Any] = []
    plain_answered = anyio.Event()

    async def call_plain(client: StateClient) -> None:
        plain_result.append(await client.call("opts::plain", {"n": 1}))
        plain_answered.set()

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="opts", timeout=5.0,
                               retries=0) as client:
            with anyio.fail_after(20):
                # a call without a timeout is in flight the whole time `stuck` runs
                tg.start_soon(call_plain, client)
                await plain_started.wait()

                with pytest.raises(DeadlineExceeded) as caught:
                    await client.call("opts::stuck", {}, call_id="stuck-1")
                error = caught.value
                assert error.code == "DEADLINE_EXCEEDED"
                assert "opts::stuck ran longer than its timeout of 0.3 s" in error.message
                assert error.details == {"fn": "opts::stuck", "timeout_s": 0.3}
                assert stuck_cancelled.is_set()  # the run itself was cancelled
                assert stuck_runs == ["stuck-1"]

                # the reply is recorded: the same call id gets it again, nothing re-runs
                with pytest.raises(DeadlineExceeded) as again:
                    await client.call("opts::stuck", {}, call_id="stuck-1")
                assert again.value.message == error.message
                assert stuck_runs == ["stuck-1"]

                # the function without a timeout, running longer than 0.3 s, still answers
                assert not plain_result
                plain_release.set()
                await plain_answered.wait()
                assert plain_result == [{"plain": 1}]

                assert await client.call("opts::quick", {"n": 2}) == {"quick": 2}
                assert await client.call("opts::plain", {"n": 3}) == {"plain": 3}
        worker.stop()


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf, True, "1"])
def test_a_timeout_must_be_a_positive_number_of_seconds(timeout: Any) -> None:
    worker = Worker("opts", settings=Settings(redis_url="redis://127.0.0.1:1/0"))
    with pytest.raises(ValueError, match="timeout: must be a positive number of seconds"):
        worker.function("opts::x", timeout=timeout)
    assert worker.functions == {}


async def test_a_result_that_is_not_json_is_the_workers_fault(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    worker = Worker("opts", settings=settings, options=BusOptions(block_ms=50))

    @worker.function("opts::odd")
    async def odd(body: Any, call: Call) -> Any:
        return {"a set": {1, 2}}  # no JSON for a set

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="opts", timeout=5.0) as client:
            with pytest.raises(StateError) as caught:
                await client.call("opts::odd", {})
        worker.stop()
    assert caught.value.code == "INTERNAL"  # not the caller's request
    assert "opts::odd returned a result that cannot be sent as JSON" in caught.value.message
