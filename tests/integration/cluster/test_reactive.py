"""Triggers and the barrier on one server and on the 3+3 cluster, black box: a real state
service, a StateClient writing on scopes of every partition (so of every primary, the prefix
is chosen for that: `spread_prefix`) and a Worker as the trigger's target. The same writes, the
same deliveries: each once, in order per scope, with 1 bus shard and with 3."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_shard_stream
from stateworker.reactive.targets import Targets
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.cluster.conftest import SPREAD_PARTITIONS
from tests.integration.handlers import Handler

pytestmark = pytest.mark.anyio

ROUNDS = 3  # writes of each key of each scope
KEYS = ("k1", "job-1")
TRIGGER = {"function_id": "reactor::on_change", "service": "reactor"}


class InOrder(Handler):
    """The trigger's target, serving one call at a time: it runs them in the order the bus
    delivers them (a Worker serving many at once may start them in any order: on a cluster
    each call's dedupe record is on the primary of its own call id)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.worker.options = BusOptions(block_ms=50, concurrency=1)


def settings_on(url: str, prefix: str, shards: int = 1) -> Settings:
    return Settings(redis_url=url, prefix=prefix, partitions=SPREAD_PARTITIONS, bus_shards=shards)


async def write_rounds(client: StateClient, scopes: list[str]) -> None:
    """Every scope at once, each scope's writes one after another (their order is the
    scope's): ROUNDS rounds of each key, the value counting the scope's writes."""
    async def one_scope(scope: str) -> None:
        for n in range(ROUNDS * len(KEYS)):
            await client.set(scope, KEYS[n % len(KEYS)], n)

    async with anyio.create_task_group() as tg:
        for scope in scopes:
            tg.start_soon(one_scope, scope)


def dispatched_to_the_end(service: StateService) -> Any:
    """A condition: the dispatcher's position in every partition is at its stream's last
    event (so every delivery it will make has been made)."""
    async def at_the_end() -> bool:
        assert service.dispatcher is not None
        for part in range(SPREAD_PARTITIONS):
            events = service.state.keys.partition(part).events
            last = await service.state.conn.execute("XREVRANGE", events, "+", "-", "COUNT", 1)
            position = service.dispatcher.positions.get(part)
            if last and (position is None or position.id != last[0][0].decode()):
                return False
        return True
    return at_the_end


@pytest.mark.parametrize("shards", [1, 3])
async def test_triggers_get_every_partitions_events_once_in_order(
        url: str, where: str, spread_prefix: str, spread_scopes: list[str], shards: int) -> None:
    settings = settings_on(url, spread_prefix, shards)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=30) as client, \
            InOrder(settings).running() as handler:
        first = spread_scopes[0]
        for trigger_id, config in (("all", {}), ("scope", {"scope": first}), ("key", {"key": "k1"}),
                                   ("prefix", {"key_prefix": "job-"})):
            await client.call("state::register-trigger",
                              {**TRIGGER, "id": trigger_id, "config": config})
        await write_rounds(client, spread_scopes)
        writes = ROUNDS * len(KEYS)
        expected = {"all": writes * len(spread_scopes), "scope": writes,
                    "key": ROUNDS * len(spread_scopes), "prefix": ROUNDS * len(spread_scopes)}
        await until(lambda: len(handler.calls) >= sum(expected.values()), 30, "every delivery")
        await until(dispatched_to_the_end(service), 30, "the dispatcher at every stream's end")

    by_trigger: dict[str, list[dict[str, Any]]] = {name: [] for name in expected}
    for call_id, body in handler.calls:
        by_trigger[call_id.split(":")[0]].append(body)
    assert {name: len(bodies) for name, bodies in by_trigger.items()} == expected
    assert len({call_id for call_id, _ in handler.calls}) == len(handler.calls)  # each once
    every = list(range(writes))
    for scope in spread_scopes:  # each scope's events in its order
        assert [b["new_value"] for b in by_trigger["all"] if b["scope"] == scope] == every
        assert [b["new_value"] for b in by_trigger["key"] if b["scope"] == scope] == every[0::2]
        assert [b["new_value"] for b in by_trigger["prefix"] if b["scope"] == scope] == every[1::2]
    assert [(b["scope"], b["new_value"]) for b in by_trigger["scope"]] == [(first, n) for n in every]


async def test_a_barrier_over_every_partition_wakes_the_coordinator_once(
        url: str, spread_prefix: str, spread_scopes: list[str]) -> None:
    """Each producer writes its result in a scope of its own (the scopes fall in every
    partition, so the arrivals come from every dispatcher's partition at once); the
    barrier, keyed by scope, wakes the coordinator once, with every producer's result."""
    settings = settings_on(url, spread_prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=30) as client, \
            Handler(settings).running() as coordinator:
        await client.call("state::register-trigger", {**TRIGGER, "id": "fan-in", "config": {
            "key": "result", "condition_function_id": "state::barrier",
            "condition_config": {"id": "fan-in", "expect": spread_scopes, "key_from": "/scope",
                                 "carry": "/new_value"}}})
        async with anyio.create_task_group() as tg:
            for n, scope in enumerate(spread_scopes):
                tg.start_soon(client.set, scope, "result", {"rows": n})
        await until(lambda: bool(coordinator.calls), 30, "the coordinator's wake")
        await client.set(spread_scopes[0], "result", {"rows": -1})  # complete already: skipped
        await until(dispatched_to_the_end(service), 30, "the dispatcher at every stream's end")

    assert len(coordinator.calls) == 1
    (call_id, body) = coordinator.calls[0]
    assert call_id.startswith("fan-in:")
    assert body["condition_payload"] == {
        "results": {scope: {"rows": n} for n, scope in enumerate(spread_scopes)}}


async def test_concurrent_arrivals_allow_exactly_once(url: str, spread_prefix: str) -> None:
    """N producers call state::barrier at once: one `allow` with every result, N-1 `skip`s
    counting 1..N-1, on whichever primary holds the barrier's partition."""
    settings = settings_on(url, spread_prefix)
    arrivals, bid = 40, "fan-in"
    config = {"id": bid, "expect": arrivals, "carry": "/rows"}
    replies: list[dict[str, Any]] = []
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        async def arrive(n: int) -> None:
            replies.append(await client.barrier({"key": f"p{n:02d}", "rows": n}, config))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for n in range(arrivals):
                    tg.start_soon(arrive, n)

    allowed = [r for r in replies if r["decision"] == "allow"]
    assert allowed == [{"decision": "allow", "reason": f"barrier `{bid}` complete (40/40)",
                        "payload": {"results": {f"p{n:02d}": n for n in range(arrivals)}}}]
    said = f"barrier `{bid}`: "
    counted = sorted(int(r["reason"][len(said):].split("/")[0]) for r in replies
                     if r["decision"] == "skip")
    assert counted == list(range(1, arrivals))


async def test_streams_of_targets_no_trigger_names_are_removed_on_every_shard(
        url: str, spread_prefix: str) -> None:
    """reactive/targets.py on one server and on the cluster, 3 bus shards (each in a slot of
    its own): a fresh target's streams are removed, every shard, once no trigger names it;
    a named target's stay."""
    settings = settings_on(url, spread_prefix, shards=3)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=30) as client:
        assert service.dispatcher is not None
        for n in range(3):
            await client.call("state::register-trigger", {
                "id": f"t{n}", "function_id": f"fresh{n}::f", "service": f"fresh{n}"})
            await client.call("state::unregister-trigger", {"id": f"t{n}"})
        await client.call("state::register-trigger", {**TRIGGER, "id": "named"})
        await until(lambda: service.dispatcher.triggers.ids == {"named"}, 30, "loaded")
        conn = service.state.bus_conn

        async def exists(name: str) -> list[int]:
            return [await conn.execute("EXISTS", bus_shard_stream(spread_prefix, name, s))
                    for s in range(3)]

        assert [await exists(f"fresh{n}") for n in range(3)] == [[1, 1, 1]] * 3
        sweeper = Targets(service.state, sweep_s=0.0)
        loaded = service.dispatcher.triggers.triggers()
        assert [await sweeper.sweep(loaded) for _ in range(2)] == [0, 3]
        assert [await exists(f"fresh{n}") for n in range(3)] == [[0, 0, 0]] * 3
        assert await exists("reactor") == [1, 1, 1]
