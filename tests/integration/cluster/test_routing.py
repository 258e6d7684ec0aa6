"""Finding the cluster and routing to it: a seed list whose first seeds are down or a replica
still opens (and says which seed answered); one URL naming a node is found to be a cluster
(probed once at start); a pipeline spread over the primaries comes back in the caller's order;
a command whose keys span two slots is refused before anything is sent."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import pytest

from stateworker import StateStore
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.slots import CrossSlot, key_slot
from tests.cluster import RedisCluster
from tests.servers import free_port

pytestmark = pytest.mark.anyio


async def test_a_dead_seed_and_a_replica_seed_are_skipped_or_used(redis_cluster: RedisCluster) -> None:
    dead = f"redis://127.0.0.1:{free_port()}"
    replica = redis_cluster.replicas()[0].url
    conn = ClusterConnection(f"{dead},{replica}")
    try:
        await conn.connect()
        assert conn.answered == replica  # the dead one was skipped; a replica knows the map
        assert sorted(conn.primaries) == sorted(f"127.0.0.1:{n.port}"
                                                for n in redis_cluster.primaries())
    finally:
        await conn.close()


async def test_one_url_naming_a_node_is_probed_as_a_cluster(redis_cluster: RedisCluster,
                                                            prefix: str) -> None:
    async with StateStore.open(redis_cluster.url, prefix=prefix, partitions=4) as store:
        assert isinstance(store.state.conn, ClusterConnection) and store.state.cluster
        await store.call("state::set", {"scope": "s", "key": "k", "value": 1})
        assert await store.call("state::get", {"scope": "s", "key": "k"}) == 1


async def test_a_pipeline_over_every_primary_keeps_the_callers_order(
        redis_cluster: RedisCluster, prefix: str) -> None:
    conn = ClusterConnection(redis_cluster.urls)
    try:
        keys = [f"{prefix}:{{{n}}}" for n in range(60)]
        assert len({redis_cluster.owner(key_slot(k)).port for k in keys}) == 3
        await conn.pipeline([["SET", k, n] for n, k in enumerate(keys)])
        replies = await conn.pipeline([["GET", k] for k in keys])
        assert replies == [str(n).encode() for n in range(60)]
        # A transaction goes with its keys: MULTI / EXEC to the node of the commands inside.
        assert (await conn.pipeline([["MULTI"], ["INCR", keys[5]], ["EXEC"]]))[-1] == [6]
    finally:
        await conn.close()


async def test_keys_in_two_slots_are_refused_before_sending(redis_cluster: RedisCluster) -> None:
    conn = ClusterConnection(redis_cluster.urls)
    try:
        with pytest.raises(CrossSlot, match="MGET names keys in slots"):
            await conn.execute("MGET", "{a}x", "{b}y")
        with pytest.raises(CrossSlot):  # nothing of the pipeline is sent
            await conn.pipeline([["SET", "{a}z", 1], ["DEL", "{a}z", "{b}z"]])
        assert await conn.execute("GET", "{a}z") is None
    finally:
        await conn.close()


async def test_one_command_goes_straight_to_its_node_and_follows_a_move(
        redis_cluster: RedisCluster, prefix: str) -> None:
    """A lone keyed command is written to its slot's node in the caller's tick (no task);
    where the map is wrong (MOVED) it is routed again; a caller that gives up on it leaves no
    error behind when its connection then closes."""
    conn = ClusterConnection(redis_cluster.urls)
    key = f"{prefix}:{{straight}}"
    slot = key_slot(key)
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        await conn.connect()
        sent = conn.send_pipeline([["SET", key, 1]])
        assert sent is not None and not isinstance(sent, asyncio.Task)
        assert await sent == [b"OK"]
        owner = conn._owner[slot]
        conn._owner[slot] = next(a for a in conn.primaries if a != owner)  # a stale map
        refreshes = conn.refreshes
        assert await conn.pipeline([["INCR", key]]) == [2]
        assert conn._owner[slot] == owner and conn.refreshes == refreshes + 1
        given_up = conn.send_pipeline([["BLPOP", f"{prefix}:{{straight}}:empty", 30]])
        assert given_up is not None
        given_up.cancel()
        await conn.close()  # (the BLPOP's connection ends: its future fails, unawaited)
        await anyio.wait_all_tasks_blocked()
        gc.collect()
        await anyio.wait_all_tasks_blocked()
    finally:
        loop.set_exception_handler(previous)
        await conn.close()
    assert errors == []
