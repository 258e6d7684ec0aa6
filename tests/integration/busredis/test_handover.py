"""Partitions changing hands with the bus on a Redis of its own (decision 0060: a hand-on moves
the position in memory, stored within STORE_S): a replica that gives partitions back to one
that joins stores where it got first, so the joiner hands on nothing again; a replica frozen
past its lease hands on nothing once it runs again but the batch it had read."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from stateworker import StateStore
from stateworker.keys import bus_stream
from stateworker.reactive.dispatcher import Dispatcher
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

SCOPES = 8


def service_env(bus_url: str) -> dict[str, str]:
    return {"STATEWORKER_BUS_REDIS_URL": bus_url, "STATEWORKER_DURABILITY": "strict",
            "STATEWORKER_LEASE_MS": "1000"}


def handed_on(bus: RedisServer, prefix: str) -> Counter[bytes]:
    """How many times each trigger call id was appended to the handler's stream."""
    entries = bus.client().xrange(bus_stream(prefix, "reactor"))
    return Counter(fields[b"id"] for _, fields in entries)


class Writes:
    """SCOPES tasks, each writing its scope's key again and again until `stop()`; `written`
    counts the writes acknowledged (each one event, one trigger call)."""

    def __init__(self) -> None:
        self.written, self._on = 0, True

    def stop(self) -> None:
        self._on = False

    async def run(self, store: StateStore, scope: str) -> None:
        async with anyio.create_task_group() as tg:
            for i in range(SCOPES):
                tg.start_soon(self._write, store, f"{scope}-{i}")

    async def _write(self, store: StateStore, name: str) -> None:
        n = 0
        while self._on:
            n += 1
            await store.set(name, "k", n)
            self.written += 1


def holders(state: RedisServer, store: StateStore) -> set[bytes | None]:
    raw, keys = state.client(), store.state.keys
    return {raw.get(keys.partition(n).lease) for n in range(4)}


async def test_a_replica_that_gives_partitions_back_stores_where_it_got_first(
        pair: Pair, prefix: str, scope: str) -> None:
    """One replica holds the four partitions and hands on a steady flow of writes; a second
    joins, takes two (the first gives them back at a round), and writes go on until both
    hand on. Every write's call is on the handler's stream exactly once: the first stored
    the positions it had moved before it gave the partitions back."""
    settings = pair.settings(prefix)
    replicas = [ServiceProcess(pair.state.url, prefix, consumer=f"r{i}",
                               env=service_env(pair.bus.url)) for i in range(2)]
    writes = Writes()
    try:
        async with StateStore.open(settings=settings, reaper=False) as store:
            await store.call("state::register-trigger", {
                "id": "t1", "function_id": "reactor::on_change", "service": "reactor"})
            await anyio.to_thread.run_sync(replicas[0].start)
            await until(lambda: None not in holders(pair.state, store), 30, "the first's leases")
            async with anyio.create_task_group() as tg:
                tg.start_soon(writes.run, store, scope)
                await until(lambda: len(handed_on(pair.bus, prefix)) >= 200, 30, "hand-ons")
                await anyio.to_thread.run_sync(replicas[1].start)
                await until(lambda: len(holders(pair.state, store)) == 2, 30, "both holding")
                at_handover = len(handed_on(pair.bus, prefix))
                await until(lambda: len(handed_on(pair.bus, prefix)) >= at_handover + 200, 30,
                            "hand-ons after the handover")
                writes.stop()
            await until(lambda: len(handed_on(pair.bus, prefix)) == writes.written, 30,
                        f"{writes.written} calls handed on")
            counts = handed_on(pair.bus, prefix)
            assert len(counts) == writes.written
            again = {call_id: n for call_id, n in counts.items() if n > 1}
            assert not again, f"{len(again)} calls handed on again: {sorted(again)[:5]}"
    finally:
        for replica in replicas:
            await anyio.to_thread.run_sync(replica.kill)


def revision(call_id: bytes) -> tuple[int, int]:
    """The event revision of a trigger call id (`t1:p<n>:<ms>-<seq>`)."""
    ms, seq = call_id.rsplit(b":", 1)[1].split(b"-")
    return int(ms), int(seq)


async def test_a_replica_frozen_past_its_lease_hands_on_nothing_new_once_it_runs_again(
        pair: Pair, prefix: str, scope: str) -> None:
    """Two replicas share the partitions; one is frozen (SIGSTOP) mid-flow, past its lease,
    and the other takes its partitions from the positions it had stored. Handed on again
    are only events past those positions (the frozen one's moves still in memory). Once it
    runs again it learns at its first round that its leases are gone: the writes made from
    then on are each handed on once, whoever holds their partition."""
    settings = pair.settings(prefix)
    replicas = [ServiceProcess(pair.state.url, prefix, consumer=f"r{i}",
                               env=service_env(pair.bus.url)) for i in range(2)]
    try:
        async with StateStore.open(settings=settings, reaper=False) as store:
            await store.call("state::register-trigger", {
                "id": "t1", "function_id": "reactor::on_change", "service": "reactor"})
            keys, raw = store.state.keys, pair.state.client()
            frozen = replicas[0]
            await anyio.to_thread.run_sync(frozen.start)
            await until(lambda: None not in holders(pair.state, store), 30, "the first's leases")
            (token,) = holders(pair.state, store)
            await anyio.to_thread.run_sync(replicas[1].start)
            await until(lambda: len(holders(pair.state, store)) == 2, 30, "both holding")
            writes = Writes()
            async with anyio.create_task_group() as tg:
                tg.start_soon(writes.run, store, scope)
                await until(lambda: len(handed_on(pair.bus, prefix)) >= 300, 30, "hand-ons")
                await anyio.to_thread.run_sync(frozen.freeze)
                # What the frozen one stored: its successor starts there.
                held = {n for n in range(4) if raw.get(keys.partition(n).lease) == token}
                assert held, "the frozen replica held no partition"
                stored = {n: revision(b":" + raw.hget(keys.partition(n).dispatched, "id"))
                          for n in held}
                # Its leases expire (1 s) and the other takes them, while the writes go on.
                await until(lambda: token not in holders(pair.state, store), 30,
                            "the frozen one's leases taken")
                writes.stop()
            await until(lambda: len(handed_on(pair.bus, prefix)) == writes.written, 30,
                        f"{writes.written} calls handed on")
            again = [call_id for call_id, n in handed_on(pair.bus, prefix).items() if n > 1]
            for call_id in again:  # (the frozen one's, then its successor's)
                partition = int(call_id.split(b":")[1][1:])
                assert partition in held and revision(call_id) > stored[partition], call_id
            await anyio.to_thread.run_sync(frozen.thaw)
            # It runs again: it may still hand on the batch it had read (at least once), then
            # its round finds its leases gone; later it takes a share back from the other.
            await until(lambda: len(holders(pair.state, store)) == 2, 30, "shared again")
            new = []
            for n in range(200):
                name = f"{scope}-{n % SCOPES}"
                await store.set(name, "after", n)
                entry = await store.get_entry(name, "after")
                new.append(f"t1:p{keys.partition_of(name)}:{entry.revision}".encode())
            await until(lambda: len(handed_on(pair.bus, prefix).keys() & set(new)) == len(new),
                        30, "the later writes handed on")
            counts = handed_on(pair.bus, prefix)
            assert [counts[call_id] for call_id in new] == [1] * len(new)
    finally:
        for replica in replicas:
            await anyio.to_thread.run_sync(replica.kill)


async def test_a_lease_renewed_too_late_and_taken_back_hands_nothing_on_again(
        pair: Pair, prefix: str, scope: str) -> None:
    """A replica's lease on a partition runs out before its renewal (here: the lease key
    removed, as its expiry would) and no other replica takes it: the replica takes it straight
    back, finds in Redis the position it stored itself, and goes on from the one it had in
    memory. Every write's call is on the handler's stream exactly once."""
    settings = pair.settings(prefix)
    replica = ServiceProcess(pair.state.url, prefix, env=service_env(pair.bus.url))
    writes = Writes()
    try:
        async with StateStore.open(settings=settings, reaper=False) as store:
            await store.call("state::register-trigger", {
                "id": "t1", "function_id": "reactor::on_change", "service": "reactor"})
            await anyio.to_thread.run_sync(replica.start)
            await until(lambda: None not in holders(pair.state, store), 30, "its leases")
            (token,) = holders(pair.state, store)
            raw, keys = pair.state.client(), store.state.keys
            async with anyio.create_task_group() as tg:
                tg.start_soon(writes.run, store, scope)
                for partition in range(4):  # each lease lapses once, mid-flow
                    lease = keys.partition(partition).lease
                    enough = 100 * (partition + 1)
                    await until(lambda: len(handed_on(pair.bus, prefix)) >= enough,  # noqa: B023
                                30, "hand-ons")
                    raw.delete(lease)
                    await until(lambda: raw.get(lease) == token, 30,  # noqa: B023
                                "the lease taken back")
                writes.stop()
            await until(lambda: len(handed_on(pair.bus, prefix)) == writes.written, 30,
                        f"{writes.written} calls handed on")
            again = {call_id: n for call_id, n in handed_on(pair.bus, prefix).items() if n > 1}
            assert not again, f"{len(again)} calls handed on again: {sorted(again)[:5]}"
    finally:
        await anyio.to_thread.run_sync(replica.kill)


async def test_a_lease_lost_and_taken_back_in_one_round_keeps_the_moves_in_memory(
        pair: Pair, prefix: str, scope: str) -> None:
    """The same lapse met by the round itself (its renewal fails, its take wins the partition
    back at once) rather than by a store: the moves in memory since the last store stand, and
    nothing is handed on again. Driven step by step, so the round meets it every time."""
    async with StateStore.open(settings=pair.settings(prefix), reaper=False) as store:
        await store.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor"})
        dispatcher = Dispatcher(store.state)
        await dispatcher._reader.conn.try_connect()
        raw = pair.state.client()
        try:
            async with anyio.create_task_group() as tg:
                dispatcher._tg = tg
                await dispatcher._round()
                held = sorted(dispatcher.positions)
                assert held == [0, 1, 2, 3]  # (alone: every partition)

                async def hand_on(first: int) -> None:
                    """Writes to every partition, handed on with no store or round between."""
                    for n in range(first, first + 40):
                        await store.set(f"{scope}-{n % SCOPES}", "k", n)
                    with anyio.fail_after(10):
                        while len(handed_on(pair.bus, prefix)) < first + 40:
                            dispatcher._last_round = dispatcher._last_store = \
                                anyio.current_time()
                            await dispatcher._step()
                await hand_on(0)
                moved = dict(dispatcher.positions)
                assert moved != dispatcher.stored  # (handed on, not stored yet)
                for partition in held:
                    raw.delete(store.state.keys.partition(partition).lease)
                await dispatcher._round()  # renew fails, take wins: the same partitions
                assert sorted(dispatcher.leases.held) == held
                await hand_on(40)
                tg.cancel_scope.cancel()
        finally:
            await dispatcher._close()
    again = {call_id: n for call_id, n in handed_on(pair.bus, prefix).items() if n > 1}
    assert not again, f"{len(again)} calls handed on again: {sorted(again)[:5]}"
    assert len(handed_on(pair.bus, prefix)) == 80
