"""The background TTL reaper (state/expiry.py) through what a Redis does to it: `strict` with a
replica to confirm each round (WAIT), Redis away and back, the function library flushed, and
one partition whose reap fails. In each the reaper goes on, and every entry that expired gets
its state:deleted event once the fault is gone (or in the partitions it does not touch)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from stateworker import StateStore
from tests.integration.busproto import until
from tests.lua.ttl import expiring, pass_time
from tests.servers import RedisServer, primary_with_replica

pytestmark = pytest.mark.anyio

KEYS = [f"k{i:02d}" for i in range(12)]  # more than two batches (reaper_batch=5)
FAST = {"partitions": 4, "reaper_batch": 5, "reaper_interval_s": 0.05}


def scopes_in_every_partition(store: StateStore) -> list[str]:
    """One scope in each partition of the store."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < store.state.settings.partitions:
        found.setdefault(store.state.keys.partition_of(f"s{n}"), f"s{n}")
        n += 1
    return [found[p] for p in sorted(found)]


async def deleted_keys(store: StateStore, scope: str) -> list[str]:
    return sorted(e.key for e in await store.events(scope) if e.type == "state:deleted")


async def reaped(store: StateStore, scopes: list[str], what: str) -> None:
    """Write KEYS in each of `scopes` with a short TTL, wait for their expiry, then (bounded)
    for the background reaper's state:deleted event of every one."""
    await pass_time(max([await expiring(store, s, KEYS) for s in scopes]))

    async def all_deleted() -> bool:
        return all([await deleted_keys(store, s) == KEYS for s in scopes])

    await until(all_deleted, 20, what)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    with primary_with_replica(tmp_path) as servers:
        yield servers


async def test_strict_rounds_confirmed_by_a_replica(
        pair: tuple[RedisServer, RedisServer], prefix: str) -> None:
    primary, _ = pair
    async with StateStore.open(primary.url, prefix=prefix, durability="strict",
                               strict_replicas=1, **FAST) as store:
        assert store.state.confirm.needed
        await reaped(store, scopes_in_every_partition(store), "the strict reaper's deletions")


async def test_the_reaper_rides_out_redis_away(
        own_redis: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    # Every write in the AOF before its reply: under `everysec` Redis may hold the AOF's
    # write back while a background fsync runs, and a kill -9 right after the open lost its
    # generation markers now and then (the writes after the restart then STORE_LOST).
    own_redis.client().config_set("appendfsync", "always")
    async with StateStore.open(own_redis.url, prefix=prefix, connect_timeout_s=1.0,
                               **FAST) as store:
        scopes = scopes_in_every_partition(store)
        own_redis.kill()
        await until(lambda: any("reaper round failed" in r.getMessage()
                                for r in caplog.records), 20, "a round failing")
        own_redis.start()  # (the same port, its AOF)
        await reaped(store, scopes, "the deletions after Redis came back")


async def test_the_reaper_reloads_a_flushed_library(own_redis: RedisServer, prefix: str) -> None:
    async with StateStore.open(own_redis.url, prefix=prefix, **FAST) as store:
        own_redis.client().execute_command("FUNCTION", "FLUSH")
        await reaped(store, scopes_in_every_partition(store), "the deletions after the flush")


async def test_a_partition_whose_reap_fails_holds_up_no_other(
        redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    """Partition 0's ttl index is broken (a string: its reap.lua fails on WRONGTYPE every
    round); the other partitions' expired entries, more than a batch each, are all reaped,
    and a leased trigger is removed when its lease runs out."""
    caplog.set_level(logging.WARNING, "stateworker.state.expiry")
    async with StateStore.open(redis_server.url, prefix=prefix, **FAST) as store:
        scopes = scopes_in_every_partition(store)
        await store.state.conn.execute("SET", store.state.keys.partition(0).ttl, "broken")
        await store.call("state::register-trigger", {
            "id": "leased", "function_id": "reactor::on", "service": "reactor", "ttl_ms": 500})
        await reaped(store, scopes[1:], "the other partitions' deletions")
        await until(lambda: any("reaper round failed" in r.getMessage()
                                for r in caplog.records), 20, "partition 0's reap failing")

        async def no_triggers() -> bool:
            return int(await store.state.conn.execute("HLEN", store.state.keys.triggers)) == 0

        await until(no_triggers, 20, "the leased trigger removed")
