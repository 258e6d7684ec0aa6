"""A StateClient and a watch given one URL naming a node of the cluster: probed once at start,
they route by slot like the service (calls over the bus; a scope's events, and every scope's
events merged across partitions on different primaries)."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.events.model import Event
from stateworker.events.watch import Watch
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from tests.cluster import RedisCluster

pytestmark = pytest.mark.anyio


async def events_of(watch: Watch, count: int) -> list[Event]:
    got: list[Event] = []
    with anyio.fail_after(20):
        async for item in watch:
            if isinstance(item, Event):
                got.append(item)
                if len(got) == count:
                    return got
    return got


@pytest.mark.parametrize("scoped", [True, False], ids=["scope", "every-scope"])
async def test_a_client_and_a_watch_on_one_node_url(redis_cluster: RedisCluster, prefix: str,
                                                    scoped: bool) -> None:
    node = redis_cluster.replicas()[0].url  # a replica's URL even: the map sends to primaries
    settings = Settings(redis_url=node, prefix=prefix, partitions=4)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        assert isinstance(client.conn, ClusterConnection)
        await client.call("state::set", {"scope": "s0", "key": "k", "value": 0})
        start = (await client.call("state::get-entry", {"scope": "s0", "key": "k"}))["revision"]
        async with client.watch("s1" if scoped else None, None, start) as watch:
            assert isinstance(watch.conn, ClusterConnection)
            scopes = ["s1"] * 6 if scoped else [f"s{n}" for n in range(1, 7)]
            for n, scope in enumerate(scopes):
                await client.call("state::set", {"scope": scope, "key": "k", "value": n})
            got = await events_of(watch, len(scopes))
        seen = [(e.scope, bytes(e.new_value)) for e in got]
        written = [(s, str(n).encode()) for n, s in enumerate(scopes)]
        # One scope's events come in their order; events of scopes on different nodes in one
        # millisecond have ids from two clocks and sequences: no order between them is promised.
        assert (seen if scoped else sorted(seen)) == (written if scoped else sorted(written))
