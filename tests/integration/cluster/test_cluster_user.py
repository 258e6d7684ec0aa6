"""The state service as its own Redis user on the 3+3 cluster: exactly `stateworker acl-rule`'s
rule, set on every node (a cluster does not share its ACLs), passes the check at start, reads
the map (CLUSTER SHARDS) and serves calls on every primary with three bus shards, and no node
refuses it anything (ACL LOG)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from stateworker import StateClient
from stateworker.app import service_user
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from tests.cluster import RedisCluster

pytestmark = pytest.mark.anyio

PASSWORD = "cluster-service-pass"


@pytest.fixture
def service_url(redis_cluster: RedisCluster, prefix: str) -> Iterator[str]:
    """The seed list logged in as a user of its own with the service's rule on every node;
    the user is deleted again afterwards (the cluster is shared)."""
    user = f"svc-{uuid.uuid4().hex[:8]}"
    ports = redis_cluster.alive_ports()
    for port in ports:
        with redis_cluster.client(port) as admin:
            admin.execute_command("ACL", "SETUSER", user, *service_user.rule(prefix),
                                  f">{PASSWORD}")
            admin.execute_command("ACL", "LOG", "RESET")
    yield ",".join(f"redis://{user}:{PASSWORD}@127.0.0.1:{port}" for port in ports)
    for port in ports:
        with redis_cluster.client(port) as admin:
            admin.execute_command("ACL", "DELUSER", user)


async def test_the_service_serves_on_the_cluster_under_exactly_its_rule(
        redis_cluster: RedisCluster, service_url: str, prefix: str) -> None:
    settings = Settings(redis_url=service_url, prefix=prefix, partitions=4, bus_shards=3)
    admin = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=4, bus_shards=3)
    scopes = [f"s{n}" for n in range(12)]  # (every partition: every primary)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=admin, timeout=30) as client:
        assert isinstance(service.state.conn, ClusterConnection)
        assert len(service.state.conn.primaries) == 3
        for n, scope in enumerate(scopes):
            await client.call("state::set", {"scope": scope, "key": "k", "value": n})
            await client.call("state::update", {"scope": scope, "key": "k", "ops": [
                {"type": "increment", "path": "", "by": 1}]})
        got = [await client.call("state::get", {"scope": s, "key": "k"}) for s in scopes]
        assert got == [n + 1 for n in range(len(scopes))]
    for port in redis_cluster.alive_ports():
        with redis_cluster.client(port) as admin_client:
            assert admin_client.acl_log() == [], port
