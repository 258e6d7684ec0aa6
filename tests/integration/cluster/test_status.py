"""What finds the bus streams by name (SCAN) on one server and on the 3+3 cluster, where each
primary holds only its own slots' keys: `stateworker status` lists every shard of a service,
and `principal remove` finds (and deletes) the principal's stream to every service."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import redis
from redis.cluster import RedisCluster as RedisClusterClient

from stateworker import StateClient
from stateworker.app.cli import status_report
from stateworker.app.cli.status import summary
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_shard_stream, principal_stream
from stateworker.settings import Settings
from stateworker.transport.slots import SLOTS, key_slot
from tests.cluster import RedisCluster
from tests.integration.cluster.clients import keyed_client

pytestmark = pytest.mark.anyio

SHARDS, PARTITIONS = 3, 4


def primary_of(where: str, request: pytest.FixtureRequest) -> Callable[[str], int]:
    """The primary (its port) a key is on; one server: a third of the slots each, so the
    names chosen below are the same kind on both."""
    if where == "one":
        return lambda key: key_slot(key) * 3 // SLOTS
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return lambda key: cluster.owner(key_slot(key)).port


def on_three_primaries(names: Callable[[str], list[str]], owner: Callable[[str], int]) -> str:
    """A fresh name for which `names(name)` land on three different primaries."""
    while True:
        fresh = f"t{uuid.uuid4().hex[:12]}"
        if len({owner(name) for name in names(fresh)}) == 3:
            return fresh


def shard_streams(prefix: str) -> list[str]:
    return [bus_shard_stream(prefix, "state", shard) for shard in range(SHARDS)]


def lay_out_shards(client: redis.Redis | RedisClusterClient, prefix: str) -> None:
    """A 3-shard state service's streams as its replica `r1` leaves them: each shard with the
    service's group, one call appended and read (pending) by `r1`, laid out by hand so the
    pending counts are exact (a running service would answer them)."""
    for stream in shard_streams(prefix):
        client.xgroup_create(stream, "state", id="0", mkstream=True)
        client.xadd(stream, {"id": uuid.uuid4().hex, "fn": "state::get", "body": "{}"})
        client.xreadgroup("state", "r1", {stream: ">"}, count=10)


async def test_status_lists_every_shard(where: str, url: str,
                                        request: pytest.FixtureRequest) -> None:
    prefix = on_three_primaries(shard_streams, primary_of(where, request))
    lay_out_shards(keyed_client(where, request), prefix)
    urls = [url]
    if where == "cluster":  # one node's URL too: status finds the cluster behind it
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        urls.append(cluster.primaries()[0].url)
    for given in urls:
        report = await status_report(Settings(redis_url=given, prefix=prefix,
                                              partitions=PARTITIONS))
        state = report["services"]["state"]
        assert [s["stream"] for s in state["shards"]] == shard_streams(prefix)
        assert [(s["pending"], s["lag"], s["read"]) for s in state["shards"]] == \
            [(1, 0, True)] * SHARDS
        assert [(c["name"], c["pending"]) for c in state["consumers"]] == [("r1", SHARDS)]
        lines = [line for line in summary(report).splitlines() if line.startswith("  state:")]
        assert lines == ["  state: 3 shards, pending 1/1/1, lag 0/0/0"]


async def test_a_sharded_service_serves_on_the_cluster(redis_cluster: RedisCluster,
                                                       prefix: str) -> None:
    settings = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=PARTITIONS,
                        bus_shards=SHARDS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=10) as client:
        for n in range(SHARDS * 3):
            await client.call("state::set", {"scope": f"st{n}", "key": "k", "value": n})
        report = await status_report(settings)
    assert [s["pending"] for s in report["services"]["state"]["shards"]] == [0] * SHARDS


def principal_remove(url: str, prefix: str, name: str) -> dict[str, Any]:
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": str(PARTITIONS)}
    done = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", url, "principal",
                           "remove", name, "--timeout", "5"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    removed: dict[str, Any] = msgspec.json.decode(done.stdout)
    return removed


async def test_principal_remove_deletes_its_stream_to_every_service(
        where: str, url: str, prefix: str, request: pytest.FixtureRequest) -> None:
    """The principal's streams have no hash tag: one per service, anywhere on a cluster."""
    owner, streams = primary_of(where, request), dict[int, str]()
    while len(streams) < 3:  # (services drawn until each primary has one's stream)
        stream = principal_stream(prefix, f"svc{uuid.uuid4().hex[:8]}", "alice")
        streams.setdefault(owner(stream), stream)
    client = keyed_client(where, request)
    for stream in streams.values():
        client.xadd(stream, {"id": "c1"})  # (no consumer group: nothing to wait for)
    removed = principal_remove(url, prefix, "alice")
    assert removed["streams_deleted"] == sorted(streams.values())
    assert not any(client.exists(stream) for stream in streams.values())
