"""One partition's trouble with the bus on a Redis of its own (decision 0060: a hand-on moves
the position in memory): a partition whose batch fails again and again costs the others
nothing (their moves are stored, their events handed on once), and a batch running aside
(its trigger asks a bus condition) stops at a lease lost while it waits."""

from __future__ import annotations

import logging
from collections import Counter

import anyio
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_stream
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.integration.handlers import Gate

pytestmark = pytest.mark.anyio


async def test_a_partition_that_fails_every_time_costs_the_others_nothing(
        pair: Pair, prefix: str, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    """A trigger's target stream that is no stream (its length read fails: WRONGTYPE) fails
    its partition's batch at every read; another partition's events, read in the same
    steps, are handed on once each, however many times the failing one is tried again."""
    caplog.set_level(logging.WARNING, logger="stateworker.reactive")
    settings = pair.settings(prefix)
    bus = pair.bus.client()
    poison = bus_stream(prefix, "poison")
    bus.set(poison, "not a stream")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=5) as client:
        keys = service.state.keys
        names = [f"{scope}-{n}" for n in range(64)]
        good = next(name for name in names if keys.partition_of(name) == 0)
        bad = next(name for name in names if keys.partition_of(name) == 3)
        for trigger, name, service_name in (("good", good, "reactor"), ("bad", bad, "poison")):
            await client.call("state::register-trigger", {
                "id": trigger, "function_id": f"{service_name}::on_change",
                "service": service_name, "config": {"scope": name}})

        def failures() -> int:  # (each try's XLEN of the poison refused: Redis counts them)
            stats: dict[str, dict[str, int]] = bus.info("errorstats")
            return int(stats.get("errorstat_WRONGTYPE", {}).get("count", 0))

        before = failures()
        await client.set(bad, "k", 0)
        await until(lambda: failures() >= before + 1, 30, "the failing partition's first failure")
        for n in range(5):
            await client.set(good, f"k{n}", n)
        reactor = bus_stream(prefix, "reactor")
        await until(lambda: bus.xlen(reactor) >= 5, 30, "the other partition's calls")
        tried = failures()
        await until(lambda: failures() >= tried + 3, 30, "three more tries of the failing one")
        bus.delete(poison)  # mended: its call goes out
        await until(lambda: bus.exists(poison) and bus.xlen(poison) == 1, 30, "its call")
    counts = Counter(fields[b"id"] for _, fields in bus.xrange(reactor))
    assert sorted(counts.values()) == [1] * 5, counts


async def test_a_batch_aside_stops_at_a_lease_lost_while_its_condition_waits(
        pair: Pair, prefix: str, scope: str) -> None:
    """20 events whose trigger asks a condition, read as one batch that runs aside; while the
    first question waits, another replica takes the partition's lease and the round finds it
    gone. Once answered, the batch hands nothing on and asks nothing more: the next holder
    dispatches the partition from its stored position."""
    settings = pair.settings(prefix, lease_ms=1000)
    async with StateStore.open(settings=settings, reaper=False) as store:
        await store.call("state::register-trigger", {
            "id": "t", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope, "condition_function_id": "checker::gate",
                       "condition_service": "checker", "condition_timeout_ms": 60000}})
        for n in range(20):
            await store.set(scope, f"k{n}", n)
    checker = Gate(settings, answer=True)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            checker.running():
        dispatcher = service.dispatcher
        assert dispatcher is not None
        with anyio.fail_after(30):
            await checker.asked.wait()  # the first event's question, pending
        partition = service.state.keys.partition_of(scope)
        pair.state.client().set(service.state.keys.partition(partition).lease,
                                "another-replica", px=60_000)
        await until(lambda: partition not in dispatcher.leases.held, 30, "the lease found lost")
        checker.release.set()
        await until(lambda: checker.answered and partition not in dispatcher._aside, 30,
                    "the batch's end")
        assert checker.answered == ["k0"]
    assert pair.bus.client().xlen(bus_stream(prefix, "reactor")) == 0
