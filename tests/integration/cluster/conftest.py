"""The state in this process on one server and on the 3+3 Redis Cluster, parametrized: the
same test, the same expected results."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stateworker import StateStore
from stateworker.keys import KeySpace
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.servers import RedisServer


@pytest.fixture(params=["one", "cluster"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(where: str, request: pytest.FixtureRequest) -> str:
    """One server's URL, or the cluster's seed list."""
    if where == "one":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return cluster.urls


@pytest.fixture
async def store_on(url: str, prefix: str) -> AsyncIterator[StateStore]:
    async with StateStore.open(url, prefix=prefix, partitions=4) as opened:
        yield opened


SPREAD_PARTITIONS = 6  # enough partitions for a prefix to put some on each of 3 primaries


@pytest.fixture
def spread_prefix(where: str, prefix: str, request: pytest.FixtureRequest) -> str:
    """A prefix whose SPREAD_PARTITIONS partitions sit on every primary of the cluster (on one
    server: `prefix`). Which primary serves a partition follows from its hash tag, so a random
    prefix could leave one primary without any: the suffix is counted up until none is left."""
    if where == "one":
        return prefix
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    primaries = {node.port for node in cluster.primaries()}
    for attempt in range(1000):
        candidate = f"{prefix}{attempt}"
        keys = KeySpace(candidate, SPREAD_PARTITIONS)
        owners = {cluster.owner_port(key_slot(keys.partition(n).events))
                  for n in range(SPREAD_PARTITIONS)}
        if owners == primaries:
            return candidate
    raise AssertionError(f"no prefix {prefix}N puts a partition on each of {primaries}")


SPREAD_SCOPES = 12  # two scopes per partition


@pytest.fixture
def spread_scopes() -> list[str]:
    """SPREAD_SCOPES scope names falling in every one of SPREAD_PARTITIONS partitions, round
    robin (a scope's partition does not depend on the prefix): writes on them reach every
    partition, so every primary under `spread_prefix`."""
    keys = KeySpace("any", SPREAD_PARTITIONS)
    per_partition = SPREAD_SCOPES // SPREAD_PARTITIONS
    by_partition: dict[int, list[str]] = {n: [] for n in range(SPREAD_PARTITIONS)}
    n = 0
    while any(len(names) < per_partition for names in by_partition.values()):
        by_partition[keys.partition_of(f"scope-{n}")].append(f"scope-{n}")
        n += 1
    return [names[i] for i in range(per_partition) for names in by_partition.values()]
