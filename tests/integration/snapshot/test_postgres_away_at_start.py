"""A wiped Redis and PostgreSQL away while the service starts (a host rebooted: Redis back
empty, PostgreSQL still starting). The repair at start cannot ask PostgreSQL whether this
Redis is new or wiped, so the prefix stays undecided: writes are refused (STORE_LOST, not
acknowledged), and once PostgreSQL answers the snapshotter runs the repair itself (here: the
restore) and writes go on from the truth. Before, the prefix began anew blind: a create-only
write of a key PostgreSQL holds was acknowledged over an empty Redis, then refused once
PostgreSQL answered, and the restore (which asks for the keys to be deleted first) lost it."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.errors import Conflict, StoreLost
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshots import caught_up
from tests.servers import PostgresServer, RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4


async def test_a_wiped_redis_is_not_begun_anew_while_postgres_is_away(
        own_redis: RedisServer, prefix: str, postgres_server: PostgresServer,
        postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        await store.set("locks", "job-1", "alice")
        await until(lambda: caught_up(client, keys), 30, "the snapshot")
    client.flushall()
    postgres_server.stop()
    away = True
    try:
        async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
                StateStore.open(settings=settings) as store:
            with pytest.raises(StoreLost):  # (not acknowledged over the empty Redis)
                await store.set("locks", "job-1", "mallory", expected_version=0)
            assert service.state.lost is not None
            postgres_server.start()
            away = False
            await until(lambda: service.state.lost is None, 60, "repaired once PostgreSQL answers")
            assert await store.get("locks", "job-1") == "alice"
            with pytest.raises(Conflict):
                await store.set("locks", "job-1", "mallory", expected_version=0)
            assert (await store.set("locks", "job-2", "bob")).version == 1
    finally:
        if away:
            postgres_server.start()
