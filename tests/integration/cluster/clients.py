"""A redis-py client for looking at keys directly in the cluster tests: one server's, or the
cluster's own client, which sends each key to its node."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster as RedisClusterClient

from tests.cluster import RedisCluster
from tests.servers import RedisServer


def keyed_client(where: str, request: pytest.FixtureRequest) -> redis.Redis | RedisClusterClient:
    """A client of the `where` fixture's Redis (one|cluster) that sends each key to its node."""
    if where == "one":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.client()
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return RedisClusterClient(host="127.0.0.1", port=cluster.primaries()[0].port)
