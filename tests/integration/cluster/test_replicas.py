"""Replicas on a Redis Cluster: two `stateworker serve` processes given nothing but the seed
list (and 3 bus shards) share the work: each is a consumer of every shard's group (the shards
sit on different primaries), and when one is killed -9 under load the other takes its pending
calls over: every call answered, each applied once (exact counts)."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateClient
from stateworker.keys import bus_shard_stream
from stateworker.settings import Settings
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection
from tests.cluster import RedisCluster
from tests.servers import ServiceProcess

pytestmark = pytest.mark.anyio

SHARDS, SCOPES, CLIENTS, PER_CLIENT = 3, 24, 8, 30


async def consumer_names(conn: RedisConnection, stream: str) -> set[bytes]:
    consumers = await conn.execute("XINFO", "CONSUMERS", stream, "state")
    return {dict(zip(c[::2], c[1::2], strict=True))[b"name"] for c in consumers}


def increment(scope: str) -> dict[str, object]:
    return {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "", "by": 1}]}


async def test_two_replicas_share_the_shards_and_survive_a_kill(redis_cluster: RedisCluster,
                                                                 prefix: str) -> None:
    env = {"STATEWORKER_BUS_SHARDS": str(SHARDS)}
    replicas = [ServiceProcess(redis_cluster.urls, prefix, consumer=f"r{n}", env=env)
                for n in (1, 2)]
    settings = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=4,
                        bus_shards=SHARDS)
    scopes = [f"s{n}" for n in range(SCOPES)]
    results: dict[str, list[int]] = {scope: [] for scope in scopes}
    streams = [bus_shard_stream(prefix, "state", n) for n in range(SHARDS)]
    conn = connection_for(redis_cluster.urls)
    try:
        for replica in replicas:
            replica.start()
        # Each replica becomes a consumer of every shard with its first read, which follows
        # its "serving" line: polled, bounded.
        with anyio.fail_after(10):
            for stream in streams:
                while await consumer_names(conn, stream) != {b"r1", b"r2"}:
                    await anyio.sleep(0.01)
        halfway = anyio.Event()

        async def one_client(n: int) -> None:
            async with StateClient(settings=settings, timeout=60) as client:
                for i in range(PER_CLIENT):
                    scope = scopes[(n * PER_CLIENT + i) % SCOPES]
                    result = await client.call("state::update", increment(scope))
                    results[scope].append(result["new_value"])
                    if sum(map(len, results.values())) >= CLIENTS * PER_CLIENT // 2:
                        halfway.set()

        async with anyio.create_task_group() as tg:
            for n in range(CLIENTS):
                tg.start_soon(one_client, n)
            with anyio.fail_after(60):
                await halfway.wait()
            replicas[0].kill()  # SIGKILL, calls of its in flight: the other reclaims them
            answered_at_kill = sum(map(len, results.values()))
    finally:
        for replica in replicas:
            replica.kill()
        await conn.close()
    assert answered_at_kill < CLIENTS * PER_CLIENT, "the kill came after the last call"
    # Every call answered, each applied once: each scope's counter handed out 1..k.
    per_scope = CLIENTS * PER_CLIENT // SCOPES
    for scope, values in results.items():
        assert sorted(values) == list(range(1, per_scope + 1)), scope
