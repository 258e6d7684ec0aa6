"""Must show 3: `redis-cli --cluster reshard` moves a partition's slot (which is a bus shard's
slot as well) to another primary and back while 24 writers call the running state service:
no call fails (the calls meet ASK, TRYAGAIN and MOVED on the way, and only retry), and
nothing is lost (each scope's value is exactly its acknowledged increments).

Which slot `redis-cli --cluster reshard --cluster-slots 1` moves: the source's lowest (its
reshard table takes a source's slots in ascending order; there is no option naming a slot).
So the test does not move an arbitrary slot by hand (tests/cluster.py `move_slot` runs the
same steps redis-cli runs: SETSLOT IMPORTING / MIGRATING, MIGRATE ... KEYS, SETSLOT NODE);
it picks a prefix whose partition 1 hashes to the lowest slot of a primary, and lets
redis-cli itself move it: the real tool, its batches (`--cluster-pipeline`) and its order of
SETSLOT NODE. Partition 1's hash tag `{<prefix>:p1}` is also the tag of bus shard 1
(keys.bus_shard_stream), where the calls on partition 1's scopes go: the one move takes the
calls' stream, the service's consumer group on it and the state they write."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import uuid
from collections import Counter

import anyio
import anyio.to_thread
import pytest

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import STATE_SERVICE, KeySpace, bus_shard_stream
from stateworker.settings import Settings
from stateworker.transport.slots import key_slot
from tests.cluster import ClusterNode, RedisCluster
from tests.integration.cluster.writers import Writers, scopes_in

pytestmark = pytest.mark.anyio

WRITERS = 24
PARTITIONS = 4
SHARDS = 3
PARTITION = 1  # its tag is bus shard 1's too (shard 0's stream has no tag)
KEYS_PER_MIGRATE = 1  # redis-cli's --cluster-pipeline: the longest window of a split slot


def prefix_moved_by_reshard(cluster: RedisCluster) -> tuple[str, ClusterNode, ClusterNode]:
    """A prefix whose partition PARTITION's slot is the lowest slot of a primary (the one
    `--cluster reshard --cluster-slots 1` takes from it), that primary, and the primary to
    move it to: one whose slots all lie above it, so that the slot is the lowest there too
    and the same command moves it back."""
    primaries = sorted(cluster.primaries(), key=lambda node: min(lo for lo, _ in node.slots))
    target = primaries[-1]
    lowest = {min(lo for lo, _ in node.slots): node for node in primaries[:-1]}
    base = f"r{uuid.uuid4().hex[:8]}"
    for n in itertools.count():
        prefix = f"{base}{n}"
        source = lowest.get(key_slot(KeySpace(prefix, PARTITIONS).partition(PARTITION).tag))
        if source is not None:
            return prefix, source, target
    raise AssertionError("unreachable")


def reshard(cluster: RedisCluster, source: ClusterNode, target: ClusterNode) -> int:
    """`redis-cli --cluster reshard`: one slot (the source's lowest) from `source` to
    `target`. Returns how many keys it moved (a dot per MIGRATE batch in its output)."""
    cli = shutil.which("redis-cli")
    assert cli, "redis-cli is not installed (scripts/test installs it)"
    done = subprocess.run(
        [cli, "--cluster", "reshard", f"127.0.0.1:{source.port}",
         "--cluster-from", source.node_id, "--cluster-to", target.node_id,
         "--cluster-slots", "1", "--cluster-pipeline", str(KEYS_PER_MIGRATE), "--cluster-yes"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    moving = [line for line in done.stdout.splitlines() if line.startswith("Moving slot")]
    assert len(moving) == 1, done.stdout
    return moving[0].rpartition(": ")[2].count(".") * KEYS_PER_MIGRATE


def redirections(cluster: RedisCluster) -> Counter[str]:
    """The redirections and retry replies the primaries have answered with so far
    (INFO errorstats, summed over the primaries)."""
    total: Counter[str] = Counter()
    for node in cluster.primaries():
        with cluster.client(node.port) as client:
            stats = client.info("errorstats")
        for word in ("ASK", "MOVED", "TRYAGAIN"):
            total[word] += int(stats.get(f"errorstat_{word}", {}).get("count", 0))
    return total


async def test_reshard_moves_a_partition_and_a_bus_shard_while_calls_flow(
        redis_cluster: RedisCluster) -> None:
    prefix, home, away = prefix_moved_by_reshard(redis_cluster)
    keys = KeySpace(prefix, PARTITIONS)
    slot = key_slot(keys.partition(PARTITION).tag)
    assert key_slot(bus_shard_stream(prefix, STATE_SERVICE, PARTITION)) == slot
    assert redis_cluster.owner(slot).port == home.port
    scopes = scopes_in(keys, PARTITION, WRITERS)
    settings = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=PARTITIONS,
                        bus_shards=SHARDS)
    moved: list[int] = []  # keys each reshard moved
    try:
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings, timeout=60) as client:
            writers = Writers(client.call, scopes)
            await writers.zero()  # the slot holds entries (and the shard calls) before it moves
            async with anyio.create_task_group() as tg:
                writers.start(tg)
                await writers.go_on(2 * WRITERS, 30)
                before = redirections(redis_cluster)
                for source, target in ((home, away), (away, home)):
                    moved.append(await anyio.to_thread.run_sync(reshard, redis_cluster, source,
                                                                target))
                    assert redis_cluster.owner(slot).port == target.port
                    await writers.go_on(2 * WRITERS, 30)
                writers.stop()
            met = redirections(redis_cluster) - before
            values = await writers.values()
    finally:
        if redis_cluster.owner_port(slot) not in (None, home.port):  # (a failed move)
            await anyio.to_thread.run_sync(redis_cluster.move_slot, slot, home.port)
    done = writers.done
    assert [(type(exc).__name__, str(exc)) for exc in writers.errors] == []
    assert values == done  # every acknowledged increment is there, and no other
    # The slot held the scopes' state and shard 1's calls both ways (a key or more per scope).
    assert len(moved) == 2 and min(moved) >= WRITERS, moved
    # The calls met the moves: each reshard ends with MOVED for the first command on the
    # slot (ASK and TRYAGAIN, during the migration, are likely but depend on timing).
    assert met["MOVED"] >= 2, met
    assert sum(done) >= 6 * WRITERS
    assert redis_cluster.owner(slot).port == home.port  # the shared cluster as found
