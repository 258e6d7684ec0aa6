"""A principal's Redis ACL user on a Redis Cluster: Redis keeps users per node and does not
replicate them, so `principal add` / `passwd` / `remove` change every node, replicas too: the
principal logs in on any node, and still after a failover promotes a replica."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import msgspec

from tests.cluster import RedisCluster
from tests.integration.acl_users import logs_in


def cli(cluster: RedisCluster, prefix: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"}
    done = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", cluster.urls,
                           "principal", *args], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    reply: dict[str, Any] = msgspec.json.decode(done.stdout)
    return reply


def test_a_principals_user_is_on_every_node(redis_cluster: RedisCluster, prefix: str) -> None:
    who = f"p{uuid.uuid4().hex[:8]}"
    added = cli(redis_cluster, prefix, "add", who, "--role", "reader")
    nodes = redis_cluster.nodes()
    assert len(nodes) == 6 and {n.role for n in nodes} == {"primary", "replica"}
    assert all(logs_in(n.port, who, added["password"]) for n in nodes)
    rotated = cli(redis_cluster, prefix, "passwd", who)
    assert all(logs_in(n.port, who, rotated["password"]) for n in nodes)
    assert not any(logs_in(n.port, who, added["password"]) for n in nodes)
    cli(redis_cluster, prefix, "remove", who, "--timeout", "5")
    for node in nodes:
        with redis_cluster.client(node.port) as client:
            assert client.acl_getuser(who) is None, node
