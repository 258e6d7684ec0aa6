"""Without PostgreSQL nothing drains a partition's `barriers_changed` (the snapshotter's set,
snapshot/barriers.py), so barrier writes add nothing to it (decision 0063): a caller who makes
barriers, completes them or deletes them leaves the set empty, and the marks a version before
this one left there go at the next barrier write of their partition. Before, each barrier
left its member for good: 3,000 barriers, 3,000 members, shared by every caller."""

from __future__ import annotations

import pytest
import redis

from stateworker.bus.client import StateClient
from stateworker.keys import KeySpace
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4  # (the `service` and `client` fixtures')


def marks(client: redis.Redis, keys: KeySpace) -> int:
    return sum(client.scard(p.barriers_changed) for p in keys.all_partitions())


def one_per_partition(keys: KeySpace, stem: str) -> list[str]:
    """A barrier id in each partition."""
    ids: dict[int, str] = {}
    for n in range(1000):
        part = keys.all_partitions().index(keys.barrier_partition(f"{stem}{n}"))
        ids.setdefault(part, f"{stem}{n}")
    assert len(ids) == PARTITIONS
    return [ids[part] for part in sorted(ids)]


async def test_barriers_leave_no_mark_without_postgres(
        client: StateClient, redis_server: RedisServer, prefix: str) -> None:
    raw, keys = redis_server.client(), KeySpace(prefix, PARTITIONS)
    for n in range(40):  # completed, waiting, deleted (complete or not), over every partition
        await client.call("state::barrier", {"event": {"key": "a"},
                                             "condition_config": {"id": f"b{n}",
                                                                  "expect": 1 + n % 2}})
        if n % 4 == 0:
            assert (await client.call("state::delete-barrier", {"id": f"b{n}"}))["deleted"]
    assert len(raw.keys(f"{prefix}:*:b:*")) == 30  # (the 10 deleted gone)
    assert marks(raw, keys) == 0


async def test_marks_left_by_a_version_before_go(
        client: StateClient, redis_server: RedisServer, prefix: str) -> None:
    raw, keys = redis_server.client(), KeySpace(prefix, PARTITIONS)
    # What a version before this one left: a mark per barrier it ever wrote, for good.
    for part in keys.all_partitions():
        raw.sadd(part.barriers_changed, *(part.barrier(f"old{n}") for n in range(500)))
    assert marks(raw, keys) == 500 * PARTITIONS
    for barrier_id in one_per_partition(keys, "new"):
        await client.call("state::barrier", {"event": {"key": "a"},
                                             "condition_config": {"id": barrier_id,
                                                                  "expect": 2}})
    assert marks(raw, keys) == 0
