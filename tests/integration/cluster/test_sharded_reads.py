"""A read of streams in several slots (a service with STATEWORKER_BUS_SHARDS > 1 reads every
shard in one XREADGROUP; shard i lives in partition i's slot): Redis refuses it as one command
on a cluster, so `ClusterConnection` reads each slot and merges the replies."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.busproto import until

pytestmark = pytest.mark.anyio


async def test_a_sharded_service_answers_calls_on_every_shard(url: str, prefix: str) -> None:
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, bus_shards=3)
    keys = KeySpace(prefix, 4)
    scopes = [f"s{n}" for n in range(24)]
    assert {keys.partition_of(scope) % 3 for scope in scopes} == {0, 1, 2}  # every shard
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        async with anyio.create_task_group() as tg:
            for n, scope in enumerate(scopes):
                tg.start_soon(client.call, "state::set", {"scope": scope, "key": "k", "value": n})
        got = [await client.call("state::get", {"scope": s, "key": "k"}) for s in scopes]
    assert got == list(range(24))


async def test_a_read_blocked_on_three_slots_returns_the_entry_of_the_one_written(
        redis_cluster: RedisCluster, prefix: str) -> None:
    streams = [f"{prefix}:{{{prefix}:p{n}}}" for n in range(3)]
    assert len({key_slot(stream) for stream in streams}) == 3
    conn = ClusterConnection(redis_cluster.urls)
    try:
        for stream in streams:
            await conn.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
        read: list[object] = []

        async def blocked_read() -> None:  # BLOCK 0: it returns only when an entry comes
            read.append(await conn.execute("XREADGROUP", "GROUP", "g", "c", "COUNT", 10,
                                           "BLOCK", 0, "STREAMS", *streams, ">", ">", ">"))

        before = _blocked(redis_cluster)  # (another test's service may be waiting too)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(blocked_read)
                await until(lambda: _blocked(redis_cluster) == before + 3, 10,
                            "every slot's read to wait in Redis")
                entry = await conn.execute("XADD", streams[1], "*", "n", "1")
        assert read == [[[streams[1].encode(), [[entry, [b"n", b"1"]]]]]]
        pending = [(await conn.execute("XPENDING", stream, "g"))[0] for stream in streams]
        assert pending == [0, 1, 0]  # the unblocked reads took nothing

        for stream in (streams[0], streams[2]):  # entries on two slots: one reply, both
            await conn.execute("XADD", stream, "*", "n", "2")
        both = await conn.execute("XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "BLOCK", 0,
                                  "STREAMS", *streams, ">", ">", ">")
        assert sorted(stream for stream, _ in both) == [streams[0].encode(), streams[2].encode()]
    finally:
        await conn.close()


def _blocked(cluster: RedisCluster) -> int:
    """Clients waiting in a blocking command, over the cluster's primaries."""
    return sum(int(cluster.client(node.port).info("clients")["blocked_clients"])
               for node in cluster.primaries())
