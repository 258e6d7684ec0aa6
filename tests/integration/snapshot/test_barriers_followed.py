"""PostgreSQL added to a prefix that ran on Redis alone (decision 0063): barriers written
while no snapshot followed their partition were never marked changed (`barriers_changed`
stays empty without PostgreSQL), so the first snapshot copies every barrier whole, and from
then on every replica marks its barrier writes, one configured without PostgreSQL too. A
row PostgreSQL holds of a barrier gone unmarked is deleted by that copy, and a kept reply
that needs a barrier stored waits for it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import redis

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, call_field
from stateworker.settings import Settings
from stateworker.snapshot import generation as pg_generation
from stateworker.snapshot import kept
from stateworker.snapshot.snapshotter import connect
from stateworker.state import generation, lifecycle
from tests.integration.busproto import until
from tests.integration.snapshot.driven import bus_call, stored_calls
from tests.integration.snapshot.test_barrier_expiry import rows
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4


def settings_for(server: RedisServer, prefix: str, postgres_url: str | None) -> Settings:
    return Settings(redis_url=server.url, prefix=prefix, partitions=PARTITIONS,
                    postgres_url=postgres_url, lease_ms=1000)


def marks(client: redis.Redis, keys: KeySpace) -> int:
    return sum(client.scard(p.barriers_changed) for p in keys.all_partitions())


def in_redis(client: redis.Redis, keys: KeySpace, ids: list[str]) -> dict[str, dict[str, str]]:
    """id -> the barrier's hash as text, of those Redis holds."""
    found = {i: client.hgetall(keys.barrier_partition(i).barrier(i)) for i in ids}
    return {i: {k.decode(): v.decode() for k, v in h.items()} for i, h in found.items() if h}


def stored(postgres_url: str, prefix: str) -> dict[str, dict[str, str]]:
    return {i: row["fields"] for i, row in rows(postgres_url, prefix).items()}


async def arrive(client: StateClient, barrier_id: str, key: str, expect: int) -> Any:
    return await client.call("state::barrier", {"event": {"key": key}, "condition_config": {
        "id": barrier_id, "expect": expect}})


async def test_postgres_added_later_gets_every_barrier_made_without_it(
        redis_server: RedisServer, prefix: str, postgres_url: str) -> None:
    raw, keys = redis_server.client(), KeySpace(prefix, PARTITIONS)
    alone = settings_for(redis_server, prefix, None)
    ids = [f"b{n}" for n in range(24)]
    async with StateService.running(alone, BusOptions(block_ms=50)), \
            StateClient(settings=alone, timeout=30) as client:
        for n, barrier_id in enumerate(ids):  # completed, waiting, deleted
            await arrive(client, barrier_id, "a", 1 + n % 2)
            if n % 3 == 0:
                await client.call("state::delete-barrier", {"id": barrier_id})
    assert marks(raw, keys) == 0
    made = in_redis(raw, keys, ids)
    assert len(made) == 16
    snapshot = settings_for(redis_server, prefix, postgres_url)
    async with StateService.running(snapshot, BusOptions(block_ms=50)), \
            StateClient(settings=snapshot, timeout=30) as client:
        await until(lambda: stored(postgres_url, prefix) == made, 30,
                    "every barrier made without PostgreSQL in it")
        # Changed with the snapshot on: by this service, and by a replica configured
        # without PostgreSQL (the partitions' mark is in Redis, not in its settings).
        await arrive(client, "b1", "b", 2)  # completes it
        async with StateStore.open(redis_server.url, prefix=prefix,
                                   partitions=PARTITIONS) as other:
            assert await other.delete_barrier("b2") is True
            await other.barrier({"key": "a"}, {"id": "late", "expect": 3})
        now = in_redis(raw, keys, [*ids, "late"])
        assert "d" in now["b1"] and "b2" not in now and "late" in now
        await until(lambda: stored(postgres_url, prefix) == now and marks(raw, keys) == 0, 30,
                    "the changes since in PostgreSQL")


async def test_a_row_of_a_barrier_gone_unmarked_is_deleted(
        redis_server: RedisServer, prefix: str, postgres_url: str) -> None:
    raw, keys = redis_server.client(), KeySpace(prefix, PARTITIONS)
    snapshot, alone = (settings_for(redis_server, prefix, url) for url in (postgres_url, None))
    async with StateService.running(snapshot, BusOptions(block_ms=50)), \
            StateClient(settings=snapshot, timeout=30) as client:
        for barrier_id in ("kept", "dropped"):
            await arrive(client, barrier_id, "a", 2)
        await until(lambda: set(stored(postgres_url, prefix)) == {"kept", "dropped"}
                    and marks(raw, keys) == 0, 30, "both barriers in PostgreSQL")
    # As a version before this one left its Redis: no partition says a snapshot follows it
    # (its snapshot marked every write). Then the prefix runs without PostgreSQL a while.
    for part in keys.all_partitions():
        raw.hdel(part.history, "snapshot")
    async with StateService.running(alone, BusOptions(block_ms=50)), \
            StateClient(settings=alone, timeout=30) as client:
        await client.call("state::delete-barrier", {"id": "dropped"})
    assert marks(raw, keys) == 0
    async with StateService.running(snapshot, BusOptions(block_ms=50)):
        await until(lambda: set(stored(postgres_url, prefix)) == {"kept"}, 30,
                    "the row of the barrier deleted unmarked gone")


async def test_a_kept_reply_waits_for_the_barriers_to_be_copied(
        redis_server: RedisServer, prefix: str, postgres_url: str) -> None:
    raw, keys = redis_server.client(), KeySpace(prefix, PARTITIONS)
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=PARTITIONS) as store:
        await store.barrier({"key": "a"}, {"id": "one", "expect": 2})  # (no snapshot: unmarked)
    # A process with PostgreSQL configured that runs no snapshot (as `stateworker` commands
    # from an operator's shell): its delete-barrier keeps a reply that needs the deletion in
    # PostgreSQL. No snapshot has followed the partition yet: nothing marks the deletion.
    settings = settings_for(redis_server, prefix, postgres_url)
    call_id = "delete-one"
    home = keys.id_home(call_field(call_id))
    async with lifecycle.running(await lifecycle.connect(settings), reaper=False) as state:
        assert msgspec.json.decode(msgspec.json.encode(await bus_call(
            state, "state::delete-barrier", {"id": "one"}, call_id))) == {"deleted": True}
        assert marks(raw, keys) == 0 and raw.xlen(keys.partition(home).unsaved_kept) == 1
        pg = await connect(postgres_url)
        try:
            meta = (await generation.read(state.conn, state.keys)).meta
            assert meta is not None
            await pg_generation.adopt(pg, prefix, meta, PARTITIONS)
            # The kept-reply step before any barrier of the partition was copied: it waits.
            assert await kept.store_covered(state, pg, prefix, home, meta) == 0
            assert call_field(call_id) not in stored_calls(postgres_url, prefix)
        finally:
            await pg.close()
    async with StateService.running(settings, BusOptions(block_ms=50)):
        await until(lambda: call_field(call_id) in stored_calls(postgres_url, prefix), 30,
                    "the reply stored once the barriers were copied")
    assert "one" not in stored(postgres_url, prefix)
