"""The snapshot under faults: a `stateworker serve` killed (-9) mid-batch and restarted, and
PostgreSQL stopped for 30 s under load: Postgres converges to Redis with nothing lost, duplicated or
older; while it lags, `status` shows the lag and the error and the event trimming keeps what
the snapshot has not applied."""

from __future__ import annotations

import functools
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
    # are past them. A hard cap no 30 s of writes reach (a fast machine reached the default
    # 100,000 a partition in 25 s): what the streams keep is the trimming's doing alone.
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000, events_retain=0,
                        events_maxlen=10_000_000)
    async with StateService.running(settings, BusOptions(block_ms=50)):
        yield settings


@pytest.fixture
async def writer(snapshotting: Settings) -> AsyncIterator[StateStore]:
    """A store of the service's settings: its writes and its reaper's cap the streams alike."""
    async with StateStore.open(settings=snapshotting) as opened:
        yield opened


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
    its last one, and `status`'s snapshot part, read over and over."""

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
        self.last_write.append(time.monotonic())

    async def watch(self) -> None:
        """`status` read until the outage's end, every whole second of lag waited for (a
        reading that shows the lag past it): the readings span the outage however slowly
        this machine runs them, and a lag that stops growing fails the wait."""
        second = 1
        while time.monotonic() < self.end:
            await until(functools.partial(self.shows, second * 1000), 10,
                        f"`status` to show a lag of {second} s")
            second += 1

    async def shows(self, lag_ms: int) -> bool:
        await self.sample()
        return bool(self.samples[-1]["lag_ms"] >= lag_ms)

    async def sample(self) -> None:
        shown = (await status_report(self.settings))["snapshot"]
        self.samples.append({
            "at": time.monotonic(), "last_error": shown["last_error"],
            "lag_events": sum(p["lag_events"] for p in shown["partitions"]),
            "lag_ms": max(p["lag_ms"] or 0 for p in shown["partitions"])})


async def test_postgres_down_30_s_under_load(
        snapshotting: Settings, redis_server: RedisServer, writer: StateStore,
        postgres_server: PostgresServer, postgres_url: str) -> None:
    await mixed_writes(writer, 2000, seed=1)
    client, keys = redis_server.client(), writer.state.keys
    await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
    postgres_server.stop()
    outage = Outage(snapshotting, OUTAGE_S)
    try:
        async with anyio.create_task_group() as tg:
            for worker in range(4):
                tg.start_soon(outage.write, writer, worker)
            tg.start_soon(outage.watch)
        await outage.sample()
        # The writes went on, all of them answered, for the whole outage.
        assert min(outage.last_write) >= outage.end and outage.writes >= 4 * CHUNK
        # The lag grew all along and is shown: the oldest event PostgreSQL lacks is from
        # the outage's first moments, the events behind are every write since.
        lags = [s["lag_ms"] for s in outage.samples]
        assert lags == sorted(lags)
        assert lags[-1] >= (OUTAGE_S - 3) * 1000
        first = next(s for s in outage.samples if s["lag_ms"] >= 1000)
        assert outage.samples[-1]["lag_events"] > first["lag_events"] > 0
        assert "PostgreSQL" in outage.samples[-1]["last_error"]
        # The dispatcher is at the ends, the snapshot is not: the events after the
        # snapshot's position stay.
        await dispatch_round_done(redis_server, writer)
        for part in keys.all_partitions():
            info = client.xinfo_stream(part.events)
            trimmed = info["entries-added"] - info["length"]
            assert trimmed <= int(client.hget(part.snapshotted, "n"))
    finally:
        postgres_server.start()
    await assert_converged(redis_server, writer, postgres_url)
    shown = (await status_report(snapshotting))["snapshot"]
    assert all(p["lag_events"] == 0 for p in shown["partitions"])


async def test_postgres_down_the_lag_grows_on_after_the_cap_cut_what_it_lacks(
        redis_server: RedisServer, prefix: str, postgres_server: PostgresServer,
        postgres_url: str) -> None:
    # A cap of about 200 events a partition: with PostgreSQL down the writes go on, the cap
    # cuts the oldest events PostgreSQL lacks, and the lag `status` shows must not drop to
    # the age of the oldest event kept (it would go backwards while nothing is applied).
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000, events_maxlen=200)
    client = redis_server.client()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        keys = store.state.keys
        await mixed_writes(store, 200, seed=11)
        await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
        postgres_server.stop()
        try:
            await mixed_writes(store, 40, seed=12)
            # The oldest event PostgreSQL lacks, per partition (read before the cap cuts it).
            lacked: dict[str, int] = {}
            for part in keys.all_partitions():
                done = client.hget(part.snapshotted, "id").decode()
                ((first, _),) = client.xrange(part.events, "(" + done, "+", count=1)
                lacked[part.events] = int(first.split(b"-")[0])

            async def lags() -> list[int]:
                shown = (await status_report(settings))["snapshot"]
                return [p["lag_ms"] for p in shown["partitions"]]

            async def a_second_behind() -> bool:
                return min(await lags()) >= 1000

            # The events written from now on are a second younger than those it lacks.
            await until(a_second_behind, 30, "a lag of a second in every partition")
            before = await lags()
            await mixed_writes(store, 4000, seed=13)
            for part in keys.all_partitions():  # the cap cut events PostgreSQL lacks
                info = client.xinfo_stream(part.events)
                assert info["entries-added"] - info["length"] > int(
                    client.hget(part.snapshotted, "n"))
            at_least = {events: now_ms() - ms for events, ms in lacked.items()}
            after = await lags()
            for part, was, shown in zip(keys.all_partitions(), before, after, strict=True):
                assert shown >= at_least[part.events] and shown > was
        finally:
            postgres_server.start()
        await assert_converged(redis_server, store, postgres_url)
        shown = (await status_report(settings))["snapshot"]
        assert all(p["lag_events"] == 0 for p in shown["partitions"])
