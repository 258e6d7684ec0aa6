"""Replicas whose clocks disagree (NTP drift, a VM resumed, a clock stepped) share one Redis:
each takes its time from Redis's clock (stateworker/clock.py), so they agree on the call
records' time slices and on expiry. One replica runs 40 s ahead (faketime), the other on time,
one after the other, so each call goes to the replica the test means.

Before, each brought its own clock: a retry of a call applied by the replica ahead, handled
by the other, was applied again (its record was in a slice the other never looks in: two
slices ahead of its own), and a key written with a TTL shorter than the skew read as gone on
the replica ahead at once (its reaper deleted it there and then); a worker ahead by more than
a call's timeout refused every call as past its deadline (a trigger's condition calls, 5 s by
default, among them: their events were not delivered)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import redis.asyncio as aredis

from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from tests.integration.busproto import receive, send
from tests.servers import RedisServer, ServiceProcess, skewed

pytestmark = pytest.mark.anyio

AHEAD_S = 40  # more than two slices of WINDOW_MS: the replica ahead writes where no other looks
WINDOW_MS = 60_000  # the dedupe window (slices of 15 s)
ENV = {"STATEWORKER_DEDUPE_WINDOW_MS": str(WINDOW_MS), "STATEWORKER_DISPATCH": "false"}


async def call(raw: aredis.Redis, prefix: str, fn: str, body: object,
               call_id: str | None = None) -> dict[str, object]:
    """One call over the bus (no deadline: the test's clock is neither replica's)."""
    _, reply = await send(raw, prefix, fn, body, call_id=call_id)
    return await receive(raw, reply)


def replica(server: RedisServer, prefix: str, name: str, ahead_s: float = 0) -> ServiceProcess:
    env = {**ENV, **skewed(ahead_s)} if ahead_s else ENV
    return ServiceProcess(server.url, prefix, name, env=env)


async def test_a_retry_on_a_replica_whose_clock_is_behind_is_not_applied_again(
        redis_server: RedisServer, prefix: str) -> None:
    raw = aredis.Redis(port=redis_server.port)
    ahead, on_time = replica(redis_server, prefix, "ahead", AHEAD_S), replica(
        redis_server, prefix, "on-time")
    increment = {"scope": "s", "key": "counter",
                 "ops": [{"type": "increment", "path": "n", "by": 1}]}
    try:
        ahead.start()
        first = await call(raw, prefix, "state::update", increment, "increment-once")
        assert first["ok"], first
        ahead.kill()
        on_time.start()
        again = await call(raw, prefix, "state::update", increment, "increment-once")
        assert again == first  # the recorded reply, not a second increment
        read = await call(raw, prefix, "state::get", {"scope": "s", "key": "counter"})
        assert read["result"] == {"n": 1}
    finally:
        ahead.kill()
        on_time.kill()
        await raw.aclose()


async def test_a_key_lives_its_ttl_on_a_replica_whose_clock_is_ahead(
        redis_server: RedisServer, prefix: str) -> None:
    raw = aredis.Redis(port=redis_server.port)
    on_time, ahead = replica(redis_server, prefix, "on-time"), replica(
        redis_server, prefix, "ahead", AHEAD_S)
    lease = {"scope": "s", "key": "lease", "value": "held", "ttl_ms": 30_000}
    try:
        on_time.start()
        written = await call(raw, prefix, "state::set", lease)
        assert written["ok"], written
        on_time.kill()
        ahead.start()
        read = await call(raw, prefix, "state::get", {"scope": "s", "key": "lease"})
        assert read["result"] == "held"  # 30 s to go, whatever this replica's own clock says
    finally:
        on_time.kill()
        ahead.kill()
        await raw.aclose()


WORKER = """
    import sys
    from stateworker import Worker
    from stateworker.settings import Settings

    worker = Worker("clocks", settings=Settings(redis_url=sys.argv[1], prefix=sys.argv[2],
                                                partitions=4))


    @worker.function("clocks::echo")
    async def echo(body, call):
        return body


    worker.serve()
"""


async def test_a_worker_whose_clock_is_ahead_serves_calls_within_their_deadline(
        redis_server: RedisServer, prefix: str) -> None:
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKER), redis_server.url,
                               prefix],
                              env={**os.environ, **skewed(AHEAD_S)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    try:
        async with StateClient(settings=settings, service="clocks", timeout=20) as client:
            assert await client.call("clocks::echo", {"n": 1}) == {"n": 1}
    finally:
        worker.kill()
        worker.wait(timeout=30)
