"""A wiped Redis (FLUSHALL, or a new empty server) rebuilt from PostgreSQL, by `stateworker
restore` or by the repair at start: every entry, version, topic and expiry is back, barriers
keep their arrivals (a half-full one completes exactly once with the rest, a completed one
stays complete), claims still refuse the public functions, triggers deliver new writes and
none fires for a restored entry. With `repair` off the service refuses and names the
command; a Redis behind PostgreSQL that still holds entries is never merged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from stateworker import StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import ConfigError
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.snapshot.barriers import follow, forget
from stateworker.state.kv.packed import unpack
from tests.integration.busproto import until
from tests.integration.snapshot.test_restore import dump, restore_command
from tests.integration.snapshots import all_dispatched, caught_up, mixed_writes, nothing_to_reap
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4
TRIGGER = {"id": "t1", "function_id": "reactor::on_change", "service": "reactor",
           "config": {"scope": "s1"}}
HALF = {"id": "half", "expect": ["a", "b", "c"]}  # one of three arrived before the wipe
COUNTED = {"id": "counted", "expect": 2}  # one of two
DONE = {"id": "done", "expect": 1}  # completed before the wipe, by the arrival of token "tok"
BARRIERS = ("half", "counted", "done")


def settings_for(redis_url: str, prefix: str, postgres_url: str, **extra: Any) -> Settings:
    return Settings(redis_url=redis_url, prefix=prefix, partitions=PARTITIONS,
                    postgres_url=postgres_url, lease_ms=1000, **extra)


def barrier_hashes(client: redis.Redis, keys: KeySpace) -> dict[str, dict[bytes, bytes]]:
    return {b: client.hgetall(keys.barrier_partition(b).barrier(b)) for b in BARRIERS}


def snapshot_holds_all(client: redis.Redis, keys: KeySpace, url: str, prefix: str) -> bool:
    """Entries caught up, no barrier change left to store, registry and barriers in PostgreSQL."""
    if not (caught_up(client, keys) and nothing_to_reap(client, keys, now_ms())):
        return False
    if any(client.scard(p.barriers_changed) for p in keys.all_partitions()):
        return False
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM sw_triggers WHERE prefix = %(p)s),"
            " (SELECT count(*) FROM sw_claims WHERE prefix = %(p)s),"
            " (SELECT count(*) FROM sw_barriers WHERE prefix = %(p)s)", {"p": prefix}).fetchone()
    return row == (1, 1, len(BARRIERS))


async def seed(client: redis.Redis, settings: Settings) -> tuple[dict[bytes, Any], dict[str, Any]]:
    """Entries, a trigger, a claim and three barriers, snapshotted; what Redis held then."""
    assert settings.redis_url is not None and settings.postgres_url is not None
    keys = KeySpace(settings.prefix, PARTITIONS)
    async with StateStore.open(settings.redis_url, prefix=settings.prefix,
                               partitions=PARTITIONS) as store, \
            StateService.running(settings, BusOptions(block_ms=50)):
        await store.call("state::register-trigger", TRIGGER)
        await store.claim_namespace("billing", ["private"], caller="billing")
        await mixed_writes(store, 400, seed=11)
        await store.set("s1", "tagged", [1.50, "é"], topic="red", ttl_ms=3_600_000)
        await store.set("s2", "twice", "x")
        await store.set("s2", "twice", "y")  # version 2
        assert (await store.barrier({"key": "a", "v": 1}, HALF)).decision == "skip"
        assert (await store.barrier({"key": "x"}, COUNTED)).decision == "skip"
        done = await store.barrier({"key": "only"}, DONE, token="tok")
        assert done.decision == "allow"
        await until(lambda: snapshot_holds_all(client, keys, settings.postgres_url or "",
                                               settings.prefix), 60, "the snapshot to hold all")
        return dump(client, settings.prefix), barrier_hashes(client, keys)


async def check_restored(client: redis.Redis, settings: Settings, entries: dict[bytes, Any],
                         barriers: dict[str, Any]) -> None:
    """Redis holds what it held before the wipe, and it behaves so (the service running)."""
    assert settings.redis_url is not None
    keys = KeySpace(settings.prefix, PARTITIONS)
    assert dump(client, settings.prefix) == entries
    assert barrier_hashes(client, keys) == barriers
    async with StateStore.open(settings.redis_url, prefix=settings.prefix,
                               partitions=PARTITIONS) as store:
        # The half-full barrier kept `a`: `a` again only replaces it, `c` completes it once.
        again = await store.barrier({"key": "a", "v": 2}, HALF)
        assert again.decision == "skip" and "already counted, still 1/3" in again.reason
        assert (await store.barrier({"key": "b", "v": 3}, HALF)).decision == "skip"
        allowed = await store.barrier({"key": "c", "v": 4}, HALF)
        assert allowed.decision == "allow"
        assert allowed.payload == {"results": {"a": {"key": "a", "v": 2},
                                               "b": {"key": "b", "v": 3},
                                               "c": {"key": "c", "v": 4}}}
        assert (await store.barrier({"key": "c", "v": 5}, HALF)).decision == "skip"
        counted = await store.barrier({"key": "y"}, COUNTED)
        assert counted.decision == "allow" and set(counted.payload["results"]) == {"x", "y"}
        # The completed one stays complete; its completing token still gets its allow.
        late = await store.barrier({"key": "late"}, DONE)
        assert late.decision == "skip" and "already complete" in late.reason
        repeated = await store.barrier({"key": "only"}, DONE, token="tok")
        assert repeated.decision == "allow"
        assert repeated.payload == {"results": {"only": {"key": "only"}}}
        # The claim holds: the public functions refuse the claimed scope.
        with pytest.raises(StateError) as refused:
            await store.get("private", "k")
        assert refused.value.code == "RESERVED_SCOPE"
        # The trigger delivers a new write, and only it: no restored entry fired.
        await store.set("s1", "after-restore", 1)
        reactor = f"{settings.prefix}:bus:reactor"

        await until(lambda: client.exists(reactor) and all_dispatched(client, keys), 30,
                    "the new write dispatched")
        calls = client.xrange(reactor)
        assert len(calls) == 1 and b"after-restore" in calls[0][1][b"body"]


async def test_restore_brings_back_barriers_claims_and_triggers(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client = own_redis.client()
    entries, barriers = await seed(client, settings)
    assert all(barriers.values()) and b"d" in barriers["done"] and b"aa" in barriers["half"]

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert '"barriers":3' in done.stdout
    async with StateService.running(settings, BusOptions(block_ms=50)):
        await check_restored(client, settings, entries, barriers)


@pytest.mark.parametrize("wipe", ["flushall", "new server"])
async def test_the_service_repairs_a_wiped_redis_at_start(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, wipe: str) -> None:
    client = own_redis.client()
    entries, barriers = await seed(client, settings_for(own_redis.url, prefix, postgres_url))
    target = own_redis
    if wipe == "flushall":
        client.flushall()
    else:
        target = RedisServer(tmp_path / "new-redis")
        target.start()
    try:
        settings = settings_for(target.url, prefix, postgres_url)
        caplog.set_level("INFO", logger="stateworker.snapshot.repair")
        async with StateService.running(settings, BusOptions(block_ms=50)):
            repaired = [r.getMessage() for r in caplog.records
                        if getattr(r, "event", "") == "repair.start"]
            assert repaired and "no meta hash" in repaired[0]
            await check_restored(target.client(), settings, entries, barriers)
    finally:
        if target is not own_redis:
            target.kill()


async def test_with_repair_off_the_service_refuses_and_names_the_command(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    client = own_redis.client()
    entries, barriers = await seed(client, settings_for(own_redis.url, prefix, postgres_url))
    client.flushall()
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": str(PARTITIONS),
           "STATEWORKER_POSTGRES_URL": postgres_url, "STATEWORKER_REPAIR": "false"}
    serve = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", own_redis.url,
                            "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert serve.returncode == 2, serve.stderr
    assert "run `stateworker restore`" in serve.stderr and "STATEWORKER_REPAIR=false" in serve.stderr
    assert "no meta hash" in serve.stderr
    assert client.dbsize() == 0  # left as found: the next start sees the same

    # So again, in-process; then the command it names rebuilds Redis.
    with pytest.raises(ConfigError, match="stateworker restore"):
        async with StateService.running(settings_for(own_redis.url, prefix, postgres_url,
                                                     repair=False)):
            pass
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    settings = settings_for(own_redis.url, prefix, postgres_url, repair=False)
    async with StateService.running(settings, BusOptions(block_ms=50)):  # nothing to repair now
        await check_restored(client, settings, entries, barriers)


async def test_a_redis_of_other_data_that_holds_entries_is_not_merged(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    client = own_redis.client()
    settings = settings_for(own_redis.url, prefix, postgres_url)
    await seed(client, settings)
    client.flushall()
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        await store.set("s2", "new", 1)  # a new generation of the prefix in this Redis
    with pytest.raises(ConfigError) as refused:
        async with StateService.running(settings):
            pass
    message = str(refused.value)
    assert "PostgreSQL follows" in message and "does not merge" in message
    assert "stateworker restore" in message
    stored = client.get(KeySpace(prefix, PARTITIONS).for_scope("s2").entry("s2", "new"))
    assert unpack(stored).value == b"1"


async def test_a_barrier_written_again_after_it_was_read_stays_marked(store: StateStore) -> None:
    """forget.lua unmarks a barrier only at the write count stored: a later write keeps it
    marked for the next round (else PostgreSQL would keep the older state for good)."""
    config = {"id": "marked", "expect": 3}
    part = store.state.keys.barrier_partition("marked")
    name = part.barrier("marked")
    # (a snapshot follows the partition, as a service with PostgreSQL makes it: marked writes)
    await follow(store.state, [store.state.keys.all_partitions().index(part)])
    await store.barrier({"key": "a"}, config)
    assert [int(await store.state.conn.execute("HGET", name, "w"))] == [1]
    await store.barrier({"key": "b"}, config)
    await forget(store.state, part, [name.encode()], {name: "1"})  # the state of write 1
    assert await store.state.conn.execute("SISMEMBER", part.barriers_changed, name) == 1
    await forget(store.state, part, [name.encode()], {name: "2"})
    assert await store.state.conn.execute("SISMEMBER", part.barriers_changed, name) == 0
    await store.barrier({"key": "c"}, config)  # completes it: marked again, count kept
    assert await store.state.conn.execute("SISMEMBER", part.barriers_changed, name) == 1
    assert await store.state.conn.execute("HGET", name, "w") == b"3"
