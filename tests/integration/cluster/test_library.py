"""The function library on a cluster: loaded on every primary at start, and again on a node
that answers a call with "Function not found" (here: FUNCTION FLUSH on one primary, as a new
node or a replica promoted without it would be); the call that met it is repeated and succeeds."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.keys import KeySpace
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.cluster.writers import scopes_in

pytestmark = pytest.mark.anyio


def libraries(cluster: RedisCluster, port: int) -> set[str]:
    with cluster.client(port) as client:
        listed = client.execute_command("FUNCTION", "LIST")
    names = set()
    for library in listed:
        fields = dict(zip(library[::2], library[1::2], strict=True)) if isinstance(library, list) \
            else library
        names.add(fields[b"library_name"].decode())
    return names


async def test_the_library_is_on_every_primary_and_reloaded_where_missing(
        redis_cluster: RedisCluster, prefix: str) -> None:
    for node in redis_cluster.primaries():  # start from nothing: every primary lacks it
        with redis_cluster.client(node.port) as client:
            client.execute_command("FUNCTION", "FLUSH")
    async with StateStore.open(redis_cluster.urls, prefix=prefix, partitions=4) as store:
        name = store.state.library.library
        assert all(name in libraries(redis_cluster, n.port) for n in redis_cluster.primaries())
        keys = KeySpace(prefix, 4)
        (scope,) = scopes_in(keys, 2, 1)
        owner = redis_cluster.owner(key_slot(keys.partition(2).tag))
        with redis_cluster.client(owner.port) as client:
            client.execute_command("FUNCTION", "FLUSH")  # that node alone loses it
        assert name not in libraries(redis_cluster, owner.port)
        done = await store.call("state::set", {"scope": scope, "key": "k", "value": 1})
        assert done["created"] is True
        assert name in libraries(redis_cluster, owner.port)
        assert await store.call("state::get", {"scope": scope, "key": "k"}) == 1
