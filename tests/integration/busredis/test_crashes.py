"""Crashes with the bus on a Redis of its own (decision 0056): a kill -9 of the service
mid-flood loses no write it acknowledged (the state script's reply, after its fsync, comes
before the reply on the bus), and a trigger's delivery survives a kill -9 of the service
between its hand-on (XADD to the bus Redis) and the move of the position (on the state
Redis): at least once, whichever of the two the kill falls on."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateStore
from stateworker.bus.client import StateClient
from stateworker.keys import bus_stream
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair, assert_kept, flood_until
from tests.integration.handlers import Handler
from tests.servers import FaultProxy, RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

WRITERS = 32
ACKED_BEFORE_KILL = 600


def service_env(bus_url: str) -> dict[str, str]:
    return {"STATEWORKER_BUS_REDIS_URL": bus_url, "STATEWORKER_DURABILITY": "strict",
            "STATEWORKER_LEASE_MS": "1000"}


async def test_kill_9_of_the_service_mid_flood_loses_no_acknowledged_write(
        pair: Pair, prefix: str, scope: str) -> None:
    service = ServiceProcess(pair.state.url, prefix, env=service_env(pair.bus.url))
    service.start()
    try:
        async with StateClient(settings=pair.settings(prefix), timeout=2) as client:
            acked = await flood_until(client, scope, WRITERS, ACKED_BEFORE_KILL, service.kill)
    finally:
        service.kill()
    # The state Redis killed too, and restarted on its AOF: every acknowledged write is there
    # (of the one in flight at the kill, applied or not).
    pair.state.kill()
    pair.state.start()
    await assert_kept(pair.state, prefix, scope, acked)
    assert sum(acked) >= ACKED_BEFORE_KILL


def deliveries(bus: RedisServer, prefix: str, call_id: str) -> int:
    """How many times the trigger call `call_id` was appended to the handler's stream."""
    entries = bus.client().xrange(bus_stream(prefix, "reactor"))
    return sum(1 for _, fields in entries if fields.get(b"id") == call_id.encode())


@pytest.mark.parametrize("held", ["advance", "hand_on"])
async def test_a_delivery_survives_a_kill_9_between_hand_on_and_advance(
        pair: Pair, prefix: str, scope: str, held: str) -> None:
    """`advance`: the move of the position is held on its way to the state Redis (the call is
    on the bus already: it must be), the service is killed, a new one hands the event on
    again. `hand_on`: the call's XADD is held on its way to the bus Redis (the position must
    not have moved yet), the service is killed, a new one hands it on."""
    settings = pair.settings(prefix)
    state_proxy, bus_proxy = FaultProxy(pair.state.port), FaultProxy(pair.bus.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            settings=settings, reaper=False) as store:
        await tg.start(state_proxy.serve)
        await tg.start(bus_proxy.serve)
        await store.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        first = ServiceProcess(state_proxy.url, prefix, env=service_env(bus_proxy.url))
        await anyio.to_thread.run_sync(first.start)
        try:
            # The dispatcher has stored where each partition starts (its first advance.lua
            # calls, which the hold below must not take for the one after the hand-on).
            keys, raw = store.state.keys, pair.state.client()
            await until(lambda: all(raw.exists(keys.partition(n).dispatched) for n in range(4)),
                        30, "the dispatcher's start")
            if held == "advance":
                # The dispatcher's advance.lua of the scope's partition to an event's revision
                # (its start's were to "0-0"): the key, the lease's token, a revision's length.
                part = keys.partition(keys.partition_of(scope))
                token = raw.get(part.lease)
                assert token is not None
                state_proxy.arm("hold", b"%s\r\n$%d\r\n%s\r\n$15\r\n" % (
                    part.dispatched.encode(), len(token), token))
            else:  # (the handler call's XADD names its function)
                bus_proxy.arm("hold", b"reactor::on_change")
            await store.set(scope, "k", 1)
            revision = (await store.get_entry(scope, "k")).revision
            call_id = f"t1:p{keys.partition_of(scope)}:{revision}"
            if held == "advance":
                await until(state_proxy.triggered.is_set, 30, "the position's move, held")
                # The call went out before the position was asked to move.
                assert deliveries(pair.bus, prefix, call_id) == 1
            else:
                await until(bus_proxy.triggered.is_set, 30, "the handler call, held")
        finally:
            await anyio.to_thread.run_sync(first.kill)
        # A new service (the old lease expires after lease_ms) hands the event on again.
        second = ServiceProcess(pair.state.url, prefix, env=service_env(pair.bus.url))
        await anyio.to_thread.run_sync(second.start)
        try:
            expected = 2 if held == "advance" else 1
            await until(lambda: deliveries(pair.bus, prefix, call_id) == expected, 30,
                        f"{expected} deliveries of {call_id}")
            async with Handler(settings).running() as handler:  # (at least once: a worker
                # serving both entries at once may run the id twice, docs/bus-protocol.md)
                await until(lambda: "k" in handler.delivered_keys(), 30, "the delivery")
                assert set(handler.delivered_keys()) == {"k"}
        finally:
            await anyio.to_thread.run_sync(second.kill)
        tg.cancel_scope.cancel()
