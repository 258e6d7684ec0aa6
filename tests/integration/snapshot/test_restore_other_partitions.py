"""`stateworker restore` run with another partition count than PostgreSQL's snapshot was taken
with (an operator's shell without STATEWORKER_PARTITIONS: 16) while a service of 4 partitions
runs, and a service started with another count on a wiped Redis: both are refused before
anything is written, naming both counts; run with the right count, every key is back.

Found by attack: the restore exited 0 and put every scope in the partition 16 picks; the
running service of 4 partitions then read null for 15 of 20 keys PostgreSQL held, and a
create-only write of one of them was acknowledged as new."""

from __future__ import annotations

import os
import sys

import anyio
import msgspec
import psycopg
import pytest

from stateworker import StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError, LayoutMismatch
from stateworker.keys import KeySpace
from tests.integration.busproto import until
from tests.integration.snapshot.test_lost_redis import restore_while_serving
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

SCOPES = 20


async def all_back(store: StateStore) -> list[object]:
    """Every key, once writes are let in again (STORE_LOST until the restore's last step)."""
    got: list[object] = []

    async def read() -> bool:
        try:
            got[:] = [await store.get(f"s{i}", "k") for i in range(SCOPES)]
        except StateError as exc:
            assert exc.code == "STORE_LOST"
            return False
        return True
    await until(read, 30, "the keys readable again")
    return got


async def test_a_restore_with_another_partition_count_is_refused(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        for i in range(SCOPES):
            await store.set(f"s{i}", "k", i)
        await until(lambda: caught_up(client, keys), 30, "the snapshot to catch up")

        client.flushall()
        env = {k: v for k, v in os.environ.items() if k != "STATEWORKER_PARTITIONS"}
        done = await anyio.run_process(
            [sys.executable, "-m", "stateworker", "--redis-url", own_redis.url, "restore"],
            env={**env, "STATEWORKER_PREFIX": prefix, "STATEWORKER_POSTGRES_URL": postgres_url},
            check=False)
        assert done.returncode == 1, done.stdout.decode()
        refusal = msgspec.json.decode(done.stderr.decode().strip().splitlines()[-1])
        assert refusal["code"] == "RESTORE_REFUSED"
        assert refusal["details"] == {"prefix": prefix, "partitions": 16,
                                      "snapshot_partitions": PARTITIONS}
        assert client.exists(keys.meta) == 0  # (nothing of the prefix written)

        code, summary, stderr = await restore_while_serving(own_redis.url, prefix, postgres_url)
        assert code == 0, stderr
        assert summary["entries"] == SCOPES
        assert await all_back(store) == list(range(SCOPES))

    client.flushall()
    with pytest.raises(ConfigError, match="taken with 4 partitions, not 16"):
        async with StateService.running(msgspec.structs.replace(settings, partitions=16),
                                        BusOptions(block_ms=50)):
            pass
    assert client.exists(keys.meta) == 0  # (left as found)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        assert await all_back(store) == list(range(SCOPES))


async def test_a_snapshot_of_one_scope_is_refused_with_another_count_too(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """Every entry in one scope whose CRC32 gives the same partition under 4 and under 8
    (no row in another partition to tell): the count stored with the generation refuses 8.

    Found by attack: the rows alone said nothing against 8, and positions of 4 partitions
    are all below 8; a service of 8 on the wiped Redis restored it and served, and once its
    snapshot stored positions of 8 partitions, the restore with the right count (4) was
    refused as "taken with 8 partitions"."""
    scope = next(s for s in (f"one-{n}" for n in range(100))
                 if KeySpace(prefix, 8).partition_of(s) == KeySpace(prefix, 4).partition_of(s))
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        for n in range(SCOPES):
            await store.set(scope, f"k{n}", n)
        await until(lambda: caught_up(client, keys), 30, "the snapshot to catch up")
    client.flushall()
    with pytest.raises(ConfigError, match="taken with 4 partitions, not 8"):
        async with StateService.running(msgspec.structs.replace(settings, partitions=8),
                                        BusOptions(block_ms=50)):
            pass
    assert client.exists(keys.meta) == 0  # (left as found)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        got: list[object] = []

        async def back() -> bool:
            try:
                got[:] = [await store.get(scope, f"k{n}") for n in range(SCOPES)]
            except StateError as exc:
                assert exc.code == "STORE_LOST"
                return False
            return True
        await until(back, 30, "the keys readable again")
        assert got == list(range(SCOPES))


async def test_a_generation_stored_before_its_count_gets_it_from_its_snapshotter(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """A row of `sw_generations` from before the column (NULL) is given the count by the
    first snapshotter that confirms its generation in its Redis."""
    settings = settings_for(own_redis.url, prefix, postgres_url)

    def stored() -> object:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            row = conn.execute("SELECT partitions FROM sw_generations WHERE prefix = %s",
                               (prefix,)).fetchone()
        return row[0] if row else "none"

    async with StateService.running(settings, BusOptions(block_ms=50)):
        await until(lambda: stored() == PARTITIONS, 30, "the count stored")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE sw_generations SET partitions = NULL WHERE prefix = %s", (prefix,))
    async with StateService.running(settings, BusOptions(block_ms=50)):
        await until(lambda: stored() == PARTITIONS, 30, "the count filled")


@pytest.mark.parametrize("given", [2, 8])
async def test_a_meta_hash_lost_alone_is_not_put_back_with_another_count(
        own_redis: RedisServer, prefix: str, postgres_url: str, given: int) -> None:
    """Its node lost it, the partitions' did not (a cluster), and the services start again
    with another count: refused, and the meta hash left lost alone for the right count.

    Found by attack: the repair at start put the meta hash of a prefix of 4 back with the
    count it was given. With 2 the service served (every scope of partitions 2 and 3 looked
    for in another one); with 8 the repair then refused (partitions 4-7 have no marker), but
    the meta hash kept 8, so the services of 4 were refused from then on ("created with 8
    partitions, not 4")."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        for n in range(SCOPES):
            await store.set(f"s{n}", "k", n)
        await until(lambda: caught_up(client, keys), 30, "the snapshot")
    client.delete(keys.meta)
    with pytest.raises(LayoutMismatch) as refused:
        async with StateService.running(msgspec.structs.replace(settings, partitions=given),
                                        BusOptions(block_ms=50)):
            pass
    assert refused.value.details == {"setting": "partitions", "stored": PARTITIONS,
                                     "given": given, "prefix": prefix}
    assert client.exists(keys.meta) == 0
    assert not client.exists(KeySpace(prefix, 8).partition(PARTITIONS).history)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        assert [await store.get(f"s{n}", "k") for n in range(SCOPES)] == list(range(SCOPES))
