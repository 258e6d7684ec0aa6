"""The snapshot under faults: a `stateworker serve` killed (-9) mid-batch and restarted, and
PostgreSQL stopped under load: Postgres converges to Redis with nothing lost, duplicated or
older; while it lags, `status` shows the lag and the error and the event trimming keeps what
the snapshot has not applied."""

from __future__ import annotations

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


async def test_postgres_down_under_load(
        snapshotting: Settings, redis_server: RedisServer, store: StateStore,
        postgres_server: PostgresServer, postgres_url: str) -> None:
    await mixed_writes(store, 2000, seed=1)
    client, keys = redis_server.client(), store.state.keys
    await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
    postgres_server.stop()
    try:
        async with anyio.create_task_group() as tg:
            for worker in range(4):
                tg.start_soon(mixed_writes, store, 1000, 10 + worker)
        report: dict[str, Any] = {}

        async def error_and_lag_shown() -> bool:
            report.update(await status_report(snapshotting))
            shown = report["snapshot"]
            return bool(shown["last_error"]) and any(
                p["lag_events"] > 0 and p["lag_ms"] > 0 for p in shown["partitions"])

        await until(error_and_lag_shown, 30, "status to show the snapshot's error and lag")
        assert "PostgreSQL" in report["snapshot"]["last_error"]
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
