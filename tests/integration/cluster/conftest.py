"""The state in this process on one server and on the 3+3 Redis Cluster, parametrized: the
same test, the same expected results."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stateworker import StateStore
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
