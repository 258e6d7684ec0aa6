"""kill -9 of the primary holding a partition under write load: its replica is promoted (waited
for as a condition), the calls go on on the same StateStore without a restart, and the only
errors callers see during the switch are retriable ones (UNAVAILABLE), counted. The killed node
is started again afterwards and rejoins as a replica, so the session's cluster stays 3+3."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateStore
from stateworker.keys import KeySpace
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.cluster.writers import Writers, scopes_in

pytestmark = pytest.mark.anyio

WRITERS = 16


async def test_a_primary_killed_under_load_fails_over(redis_cluster: RedisCluster,
                                                      prefix: str) -> None:
    keys = KeySpace(prefix, 4)
    slot = key_slot(keys.partition(1).tag)
    async with StateStore.open(redis_cluster.urls, prefix=prefix, partitions=4) as store:
        conn = store.state.conn
        assert isinstance(conn, ClusterConnection)
        writers = Writers(store.call, scopes_in(keys, 1, WRITERS))
        await writers.zero()
        victim = redis_cluster.owner(slot)
        async with anyio.create_task_group() as tg:
            writers.start(tg)
            await writers.go_on(10 * WRITERS, 10)  # load flowing before the kill
            redis_cluster.kill_node(victim.port)
            # The replica is promoted: the slot has a new primary.
            owner = await anyio.to_thread.run_sync(redis_cluster.promoted, slot, victim.port)
            await writers.go_on(10 * WRITERS, 20)  # the calls go on on the new primary
            writers.stop()
        assert writers.codes <= {"UNAVAILABLE"}, writers.errors
        # Only a call in flight when the primary died fails (one per writer at most): the
        # others wait for the promotion (retried with backoff) instead of failing.
        assert sum(writers.failed) <= WRITERS, writers.failed
        values = await writers.values()
        done, failed = writers.done, writers.failed
        # Nothing invented: at most the acknowledged increments plus those that failed (a call
        # lost in flight may have run). An acknowledged write not yet replicated when the
        # primary died may be lost (replication is asynchronous; `fast`): counted, bounded.
        assert all(v <= d + f for v, d, f in zip(values, done, failed, strict=True))
        lost = sum(max(d - v, 0) for v, d in zip(values, done, strict=True))
        assert lost <= WRITERS, (lost, values, done)
        assert owner in [n.port for n in redis_cluster.primaries()]
        gone = f"127.0.0.1:{victim.port}"  # dropped from the map at the refresh
        assert gone not in conn.primaries and gone not in conn.connected
    await anyio.to_thread.run_sync(redis_cluster.restart_node, victim.port)


async def test_a_send_waiting_for_a_failover_ends_with_the_connection(
        redis_cluster: RedisCluster, prefix: str) -> None:
    """A pipeline sent while its slot's primary is down waits for the promotion; closing the
    connection ends it: it lands nowhere later, and opens no connection of its own."""
    stream = f"{prefix}:s"
    slot = key_slot(stream)
    conn = ClusterConnection(redis_cluster.urls)
    await conn.connect()  # (the map read: the send below goes by it)
    victim = redis_cluster.owner(slot)
    redis_cluster.kill_node(victim.port)
    try:
        # (two commands: a pipeline runs as a task of the connection, which follows the
        # cluster until its primary is back, unless the connection ends it)
        sent = conn.send_pipeline([["XADD", stream, "*", "n", "after-close"]] * 2)
        assert sent is not None and not sent.done()
        await conn.close()
        assert sent.done()
        owner = await anyio.to_thread.run_sync(redis_cluster.promoted, slot, victim.port)
        assert redis_cluster.client(owner).xlen(stream) == 0
        assert not conn.connected
    finally:
        await anyio.to_thread.run_sync(redis_cluster.restart_node, victim.port)
