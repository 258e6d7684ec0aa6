"""The state service and a StateClient over the bus, on one server and on the 3+3 cluster:
the same calls, the same replies (the bus stream, the reply lists and the partitions sit on
different primaries of the cluster)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import count

import anyio
import pytest
import redis

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.errors import CallIdReused
from stateworker.keys import KeySpace, call_field
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from tests.integration.busproto import until

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


def _fcalls(where: str, request: pytest.FixtureRequest) -> int:
    """FCALLs run so far by the server, or by every primary of the cluster."""
    if where == "one":
        ports = [request.getfixturevalue("redis_server").port]
    else:
        ports = [node.port for node in request.getfixturevalue("redis_cluster").primaries()]
    total = 0
    for port in ports:
        with redis.Redis(port=port) as node:
            total += int(node.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))
    return total


def _first(candidates: Iterator[str], holds: Callable[[str], bool]) -> str:
    return next(candidate for candidate in candidates if holds(candidate))


async def test_a_call_costs_one_script_and_its_id_is_bound_across_partitions(
        url: str, where: str, prefix: str, request: pytest.FixtureRequest) -> None:
    """A client's state::set is one script wherever it runs (on the cluster its id's home is
    its scope's partition: the record binds it, keys.id_home); an id is still bound to its
    first call across partitions, whichever of the two ways bound it."""
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, dispatch=False,
                        reaper_interval_s=3600.0)
    keys = KeySpace(prefix, 4)
    home = _first((f"s{n}" for n in count()), lambda s: keys.partition_of(s) == 0)
    away = _first((f"s{n}" for n in count()), lambda s: keys.partition_of(s) == 1)
    homed = _first((f"pay-{n}" for n in count()), lambda i: keys.id_home(call_field(i)) == 0)
    other = _first((f"pay-{n}" for n in count()), lambda i: keys.id_home(call_field(i)) == 0
                   and i != homed)
    started = _fcalls(where, request)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        await client.call("state::set", {"scope": home, "key": "warm", "value": 0})
        # (the reaper's first round runs at start: a reap.lua per partition, keeptrigger.lua)
        before = started + 4 + 1 + 1
        await until(lambda: _fcalls(where, request) >= before, 10, "the reaper's first round")
        calls = 40
        async with anyio.create_task_group() as tg:
            for n in range(calls):
                tg.start_soon(client.call, "state::set", {"scope": f"c{n}", "key": "k", "value": n})
        assert _fcalls(where, request) - before == calls
        assert [await client.call("state::get", {"scope": f"c{n}", "key": "k"})
                for n in range(calls)] == list(range(calls))

        # At home first (the entry script binds it), then in another partition: refused.
        first = await client.call("state::set", {"scope": home, "key": "k", "value": 1},
                                  call_id=homed)
        with pytest.raises(CallIdReused):
            await client.call("state::set", {"scope": away, "key": "k", "value": 1},
                              call_id=homed)
        again = await client.call("state::set", {"scope": home, "key": "k", "value": 1},
                                  call_id=homed)
        assert again == first and first["version"] == 1
        # Away first (bound at its home in a step of its own), then at home: refused.
        await client.call("state::set", {"scope": away, "key": "j", "value": 2}, call_id=other)
        with pytest.raises(CallIdReused):
            await client.call("state::set", {"scope": home, "key": "j", "value": 2},
                              call_id=other)
        assert await client.call("state::get", {"scope": away, "key": "k"}) is None
        assert await client.call("state::get", {"scope": home, "key": "j"}) is None
        assert await client.call("state::get", {"scope": away, "key": "j"}) == 2
