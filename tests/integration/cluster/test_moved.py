"""A slot moves while calls flow (tests/cluster.py `move_slot`, as `redis-cli --cluster reshard`
moves it): the calls meet ASK / TRYAGAIN during the migration and MOVED after it, follow them,
and none fails; nothing is lost (exact counts). The map is read again once per burst of MOVED,
not once per reply."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

from stateworker import StateError, StateStore
from stateworker.keys import KeySpace
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster

pytestmark = pytest.mark.anyio

WRITERS = 16
MOVES = 2  # the slot goes to another primary and back


def scopes_in(keys: KeySpace, partition: int, count: int) -> list[str]:
    found: list[str] = []
    n = 0
    while len(found) < count:
        if keys.partition_of(f"m{n}") == partition:
            found.append(f"m{n}")
        n += 1
    return found


async def test_calls_follow_a_slot_that_moves(redis_cluster: RedisCluster, prefix: str) -> None:
    keys = KeySpace(prefix, 4)
    slot = key_slot(keys.partition(0).tag)
    scopes = scopes_in(keys, 0, WRITERS)
    done = [0] * WRITERS
    errors: list[StateError] = []
    stop = anyio.Event()
    async with StateStore.open(redis_cluster.urls, prefix=prefix, partitions=4) as store:
        conn = store.state.conn
        assert isinstance(conn, ClusterConnection)
        for scope in scopes:  # the partition holds entries before it moves
            await store.call("state::set", {"scope": scope, "key": "n", "value": 0})
        refreshes = conn.refreshes

        async def writer(i: int) -> None:
            while not stop.is_set():
                try:
                    await store.call("state::update", {"scope": scopes[i], "key": "n", "ops": [
                        {"type": "increment", "path": "", "by": 1}]})
                except StateError as exc:
                    errors.append(exc)
                    continue
                done[i] += 1

        async with anyio.create_task_group() as tg:
            for i in range(WRITERS):
                tg.start_soon(writer, i)
            home = redis_cluster.owner(slot).port
            away = next(n.port for n in redis_cluster.primaries() if n.port != home)
            moved = 0
            for port in (away, home)[:MOVES]:
                before = sum(done)
                moved += await anyio.to_thread.run_sync(redis_cluster.move_slot, slot, port)
                with anyio.fail_after(10):  # calls go on after each move
                    while sum(done) < before + 4 * WRITERS:
                        await anyio.sleep(0.01)
            stop.set()
        assert moved > 0
        assert errors == []
        values = [await store.call("state::get", {"scope": s, "key": "n"}) for s in scopes]
        assert values == done  # every acknowledged increment is there, no other
        # Two moves: the map read again a few times (once per burst of MOVED), not per reply.
        assert 1 <= conn.refreshes - refreshes <= 4 * MOVES, conn.refreshes - refreshes
