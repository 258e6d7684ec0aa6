"""Value indexes after a restore from PostgreSQL: their definitions come back (entries of the
reserved scope `state_indexes`, kept by the snapshot), the restore builds them again, and an
indexed query gives what the reference filter gives, walking the index."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshot.test_restore import restore_command
from tests.integration.snapshots import caught_up, nothing_to_reap
from tests.querymodel import put, query_all, reference
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

VALUES = ["1", "1.0", "1.10", "-0", "0", "123456789012345678901234567890", '"a"', '"ab"', "true",
          "null", "[1]", "2.5e3"]
WHERES = [
    [{"pointer": "/v", "op": "eq", "value": "1.1"}],
    [{"pointer": "/v", "op": "eq", "value": "0"}],
    [{"pointer": "/v", "op": "in", "value": '[1, "a", null]'}],
    [{"pointer": "/v", "op": "gt", "value": "2"}],
    [{"pointer": "/v", "op": "prefix", "value": '"a"'}],
    [{"pointer": "/w", "op": "eq", "value": "3"}],
]


async def test_indexes_are_rebuilt_after_a_restore(own_redis: RedisServer, prefix: str,
                                                   postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, 4)
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store, \
            StateService.running(settings, BusOptions(block_ms=50)):
        for n in range(120):
            await put(store, "orders", f"o{n:03}", f'{{"v": {VALUES[n % len(VALUES)]}, '
                                                   f'"w": {n % 7}}}')
        for pointer in ("/v", "/w"):
            await store.call("state::create-index", {"scope": "orders", "pointer": pointer})
        await store.call("state::create-index", {"scope": "other", "pointer": "/x"})
        await store.call("state::drop-index", {"scope": "other", "pointer": "/x"})
        expected = [await reference(store, "orders", where) for where in WHERES]
        await until(lambda: caught_up(client, keys) and nothing_to_reap(client, keys, now_ms()),
                    60, "the snapshot to catch up")

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert '"indexes":2' in done.stdout.replace(" ", "")

    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
        listed = await store.call("state::list-indexes", {"scope": "orders"})
        assert listed == {"indexes": [
            {"pointer": "/v", "state": "ready", "indexed": 120, "total": 120},
            {"pointer": "/w", "state": "ready", "indexed": 120, "total": 120}]}
        assert await store.call("state::list-indexes", {"scope": "other"}) == {"indexes": []}
        for where, before in zip(WHERES, expected, strict=True):
            got, used = await query_all(store, "orders", where, limit=7)
            assert got == before == await reference(store, "orders", where), where
            assert used == {where[0]["pointer"]}, where
            assert got, where
