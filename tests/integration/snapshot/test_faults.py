"""The snapshot under faults: a `stateworker serve` killed (-9) mid-batch and restarted, and
PostgreSQL stopped for 30 s under load: Postgres converges to Redis with nothing lost, duplicated or
older; while it lags, `status` shows the lag and the error and the event trimming keeps what
the snapshot has not applied."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest

from stateworker import StateStore
from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshots import (
    caught_up,
    mixed_writes,
    nothing_to_reap,
    postgres_entries,
    redis_entries,
)
from tests.servers import PostgresServer, RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio


def lagging(redis_server: RedisServer, store: StateStore) -> bool:
    client = redis_server.client()
    for part in store.state.keys.all_partitions():
        done = client.hget(part.snapshotted, "n")
        if done is not None and client.exists(part.events) and \
                int(done) < client.xinfo_stream(part.events)["entries-added"]:
            return True
    return False


async def assert_converged(redis_server: RedisServer, store: StateStore, url: str) -> None:
    client, keys = redis_server.client(), store.state.keys
    await until(lambda: caught_up(client, keys) and nothing_to_reap(client, keys, now_ms()),
                120, "the snapshot to catch up")
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT count(*), count(DISTINCT (scope, key)) FROM sw_entries "
                            "WHERE prefix = %s", (keys.prefix,)).fetchone()
    assert rows is not None and rows[0] == rows[1]
    assert postgres_entries(url, keys.prefix) == redis_entries(client, keys)


async def test_kill_9_mid_batch_then_restart_converges(
        redis_server: RedisServer, prefix: str, store: StateStore, postgres_url: str) -> None:
    env = {"STATEWORKER_POSTGRES_URL": postgres_url, "STATEWORKER_LEASE_MS": "1000",
           "STATEWORKER_DISPATCH": "false"}
    first = ServiceProcess(redis_server.url, prefix, consumer="c1", env=env)
    second = ServiceProcess(redis_server.url, prefix, consumer="c2", env=env)
    first.start()
    try:
        async with anyio.create_task_group() as tg:
            for worker in range(4):
                tg.start_soon(mixed_writes, store, 3000, worker)
            # Killed while the writes flow and its snapshot is behind them (a batch open).
            await until(lambda: lagging(redis_server, store), 30, "the snapshot to lag")
            first.kill()
            second.start()
        await assert_converged(redis_server, store, postgres_url)
    finally:
        first.kill()
        second.kill()


@pytest.fixture
async def snapshotting(redis_server: RedisServer, prefix: str,
                       postgres_url: str) -> AsyncIterator[Settings]:
    # events_retain 0: the events are trimmed as soon as the dispatcher and the snapshot
    # are past them.
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000, events_retain=0)
    async with StateService.running(settings, BusOptions(block_ms=50)):
        yield settings


async def dispatch_round_done(redis_server: RedisServer, store: StateStore) -> None:
    """Wait until the dispatcher has moved every position to its stream's end twice over
    (a write in between): a whole round, its trimming included, ran after the first."""
    client, keys = redis_server.client(), store.state.keys

    def at_ends() -> bool:
        return all(int(client.hget(p.dispatched, "n") or -1)
                   == client.xinfo_stream(p.events)["entries-added"]
                   for p in keys.all_partitions() if client.exists(p.events))

    await until(at_ends, 30, "the dispatch positions at the streams' ends")
    for n in range(keys.partitions * 8):  # one more event in (almost surely) every partition
        await store.set(f"round-{n}", "k", n)
    await until(at_ends, 30, "the dispatch positions at the streams' ends again")


OUTAGE_S = 30.0  # PostgreSQL down this long while the writes go on
CHUNK = 25  # writes between two looks at the clock


class Outage:
    """What the writers saw while PostgreSQL was down: writes made, when each writer made
    its last one, and `status`'s snapshot part sampled about once a second."""

    def __init__(self, settings: Settings, seconds: float) -> None:
        self.settings = settings
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.writes = 0
        self.last_write: list[float] = []
        self.samples: list[dict[str, Any]] = []

    async def write(self, store: StateStore, seed: int) -> None:
        """Mixed writes until the outage's end; any failed write fails the test."""
        n = 0
        while time.monotonic() < self.end:
            await mixed_writes(store, CHUNK, seed=seed * 1_000_000 + n)
            n, self.writes = n + 1, self.writes + CHUNK
            if seed == 0 and time.monotonic() - self.sampled_at() >= 1.0:
                await self.sample()
        self.last_write.append(time.monotonic())

    def sampled_at(self) -> float:
        return self.samples[-1]["at"] if self.samples else self.start

    async def sample(self) -> None:
        shown = (await status_report(self.settings))["snapshot"]
        self.samples.append({
            "at": time.monotonic(), "last_error": shown["last_error"],
            "lag_events": sum(p["lag_events"] for p in shown["partitions"]),
            "lag_ms": max(p["lag_ms"] or 0 for p in shown["partitions"])})


async def test_postgres_down_30_s_under_load(
        snapshotting: Settings, redis_server: RedisServer, store: StateStore,
        postgres_server: PostgresServer, postgres_url: str) -> None:
    await mixed_writes(store, 2000, seed=1)
    client, keys = redis_server.client(), store.state.keys
    await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
    postgres_server.stop()
    outage = Outage(snapshotting, OUTAGE_S)
    try:
        async with anyio.create_task_group() as tg:
            for worker in range(4):
                tg.start_soon(outage.write, store, worker)
        await outage.sample()
        # The writes went on, all of them answered, for the whole outage.
        assert min(outage.last_write) >= outage.end and outage.writes >= 4 * CHUNK
        # The lag grew all along and is shown: the oldest event PostgreSQL lacks is from
        # the outage's first moments, the events behind are every write since.
        lags = [s["lag_ms"] for s in outage.samples]
        assert len(lags) >= OUTAGE_S * 0.8 and lags == sorted(lags)
        assert lags[-1] >= (OUTAGE_S - 3) * 1000
        assert outage.samples[-1]["lag_events"] > outage.samples[0]["lag_events"] > 0
        assert "PostgreSQL" in outage.samples[-1]["last_error"]
        # The dispatcher is at the ends, the snapshot is not: the events after the
        # snapshot's position stay.
        await dispatch_round_done(redis_server, store)
        for part in keys.all_partitions():
            info = client.xinfo_stream(part.events)
            trimmed = info["entries-added"] - info["length"]
            assert trimmed <= int(client.hget(part.snapshotted, "n"))
    finally:
        postgres_server.start()
    await assert_converged(redis_server, store, postgres_url)
    shown = (await status_report(snapshotting))["snapshot"]
    assert all(p["lag_events"] == 0 for p in shown["partitions"])
