"""The state service and a StateClient over the bus, on one server and on the 3+3 cluster:
the same calls, the same replies (the bus stream, the reply lists and the partitions sit on
different primaries of the cluster)."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection

pytestmark = pytest.mark.anyio


async def test_calls_over_the_bus(url: str, where: str, prefix: str) -> None:
    settings = Settings(redis_url=url, prefix=prefix, partitions=4)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=30) as client:
        assert isinstance(service.state.conn, ClusterConnection) == (where == "cluster")
        if where == "cluster":
            assert service.runtime.describe["primaries"] == "3"
        scopes = [f"s{n}" for n in range(8)]
        async with anyio.create_task_group() as tg:
            for n, scope in enumerate(scopes):
                tg.start_soon(client.call, "state::set", {"scope": scope, "key": "k", "value": n})
        got = [await client.call("state::get", {"scope": s, "key": "k"}) for s in scopes]
        assert got == list(range(8))
        updated = await client.call("state::update", {"scope": "s0", "key": "k", "ops": [
            {"type": "increment", "path": "", "by": 5}]})
        assert updated["new_value"] == 5 and updated["version"] == 2
        assert await client.call("state::list_groups", {}) == {"groups": scopes}
