"""Watches on one server and on the 3+3 cluster, black box: a scoped watch and an unscoped one
(every partition, so every primary: `spread_prefix`) see every change once, in revision
order, and a watch resumed from a bookmark or from an event's revision goes on exactly there."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.events.model import Bookmark, Event, parse_revision
from stateworker.events.watch import Watch
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.busproto import until
from tests.integration.cluster.conftest import SPREAD_PARTITIONS
from tests.integration.cluster.test_reactive import TRIGGER, InOrder

pytestmark = pytest.mark.anyio

ROUNDS = 8  # writes of each scope per batch


async def write_batch(client: StateClient, scopes: list[str], batch: int) -> list[tuple[str, int]]:
    """Every scope at once, each scope's writes one after another: (scope, value) of each."""
    async def one_scope(scope: str) -> None:
        for n in range(ROUNDS):
            await client.set(scope, "k", batch * 100 + n)

    async with anyio.create_task_group() as tg:
        for scope in scopes:
            tg.start_soon(one_scope, scope)
    return [(scope, batch * 100 + n) for scope in scopes for n in range(ROUNDS)]


async def read_through(watch: Watch, count: int) -> tuple[list[Event], Bookmark]:
    """`count` events, then the bookmark that comes once the watch is quiet: no event may come
    between them (one more would be a repeat or a stray)."""
    events: list[Event] = []
    with anyio.fail_after(30):
        async for item in watch:
            if isinstance(item, Event):
                events.append(item)
            elif len(events) >= count:
                assert len(events) == count, [(e.scope, bytes(e.new_value)) for e in events]
                return events, item
    raise AssertionError("the watch ended")


async def read_while_writing(every: Watch, one: Watch, client: StateClient, scopes: list[str]
                             ) -> tuple[list[Event], list[Event], Bookmark]:
    """Batch 1 written while both watches read it: the unscoped watch's events and bookmark,
    the scoped one's events."""
    results: dict[str, tuple[list[Event], Bookmark]] = {}

    async def read(name: str, watch: Watch, count: int) -> None:
        results[name] = await read_through(watch, count)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read, "every", every, len(scopes) * ROUNDS)
        tg.start_soon(read, "one", one, ROUNDS)
        await write_batch(client, scopes, 1)
    return results["every"][0], results["one"][0], results["every"][1]


def seen(events: list[Event]) -> list[tuple[str, int]]:
    return [(e.scope, int(bytes(e.new_value))) for e in events]


def by_scope(pairs: list[tuple[str, int]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for scope, value in pairs:
        grouped.setdefault(scope, []).append(value)
    return grouped


async def test_scoped_and_unscoped_watches_see_every_change_in_order_and_resume(
        url: str, spread_prefix: str, spread_scopes: list[str]) -> None:
    settings = Settings(redis_url=url, prefix=spread_prefix, partitions=SPREAD_PARTITIONS,
                        watch_progress_s=0.3)
    first = spread_scopes[0]
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        async with client.watch() as every, client.watch(first) as one:
            # (read while the writes go on: partitions are merged as they fill)
            got, mine, bookmark = await read_while_writing(every, one, client, spread_scopes)
        written = [(scope, 100 + n) for scope in spread_scopes for n in range(ROUNDS)]
        revisions = [parse_revision(e.revision) for e in got]
        assert revisions == sorted(revisions)  # merged across partitions in revision order
        assert by_scope(seen(got)) == by_scope(written)  # each once, each scope in order
        assert seen(mine) == [(first, 100 + n) for n in range(ROUNDS)]
        assert parse_revision(bookmark.revision) >= revisions[-1]

        again = await write_batch(client, spread_scopes, 2)
        async with client.watch(None, None, bookmark.revision) as resumed:
            after_bookmark, _ = await read_through(resumed, len(again))
        assert by_scope(seen(after_bookmark)) == by_scope(again)

        middle = got[len(got) // 2]  # from an event's revision: every later one, once
        later = [e for e in got if parse_revision(e.revision) > parse_revision(middle.revision)]
        async with client.watch(None, None, middle.revision) as resumed:
            from_middle, _ = await read_through(resumed, len(later) + len(again))
        assert seen(from_middle) == seen(later) + seen(after_bookmark)
        async with client.watch(first, None, mine[1].revision) as resumed:
            scoped, _ = await read_through(resumed, ROUNDS - 2 + ROUNDS)
        assert seen(scoped) == [(first, 100 + n) for n in range(2, ROUNDS)] + \
            [(first, 200 + n) for n in range(ROUNDS)]


async def test_an_idle_unscoped_watch_wakes_for_a_write_in_any_partition(
        url: str, spread_prefix: str, spread_scopes: list[str]) -> None:
    """The watch waits on every partition at once (on a cluster: on each primary), not on
    one: a write in any of them is handed on at once, not after the quiet time (120 s here)
    that ends each wait."""
    settings = Settings(redis_url=url, prefix=spread_prefix, partitions=SPREAD_PARTITIONS,
                        watch_progress_s=120)
    one_per_partition = spread_scopes[:SPREAD_PARTITIONS]
    sent, received = anyio.create_memory_object_stream[Event](len(one_per_partition))
    with sent, received:
        await follow_writes(settings, sent, received, one_per_partition)


async def follow_writes(settings: Settings, sent: MemoryObjectSendStream[Event],
                        received: MemoryObjectReceiveStream[Event], scopes: list[str]) -> None:
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client, client.watch() as every:
        async def follow() -> None:
            async for item in every:  # (each next item is asked for at once: the watch waits)
                assert isinstance(item, Event), item
                await sent.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            for scope in scopes:  # each written once the watch waits again
                await client.set(scope, "k", 1)
                with anyio.fail_after(20):  # (far below the 120 s after which it reads anyway)
                    event = await received.receive()
                assert event.scope == scope
            tg.cancel_scope.cancel()


async def test_watches_and_triggers_follow_a_partition_to_another_primary(
        redis_cluster: RedisCluster, prefix: str) -> None:
    """A partition's slot moves to another primary and back (as `redis-cli --cluster reshard`
    moves it) between batches of writes, while an unscoped watch, a watch of a scope of that
    partition and a trigger follow: each gets every event once, in order (the watches' reads
    and waits meet MOVED on the old primary and go on at the new one)."""
    keys = KeySpace(prefix, SPREAD_PARTITIONS)
    scopes = [f"scope-{n}" for n in range(8)]
    moving = keys.partition_of(scopes[0])
    slot = key_slot(keys.partition(moving).events)
    home = redis_cluster.owner_port(slot)
    away = next(n.port for n in redis_cluster.primaries() if n.port != home)
    settings = Settings(redis_url=redis_cluster.urls, prefix=prefix,
                        partitions=SPREAD_PARTITIONS, watch_progress_s=0.3)
    events: dict[str, list[Event]] = {"every": [], "one": []}
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client, \
            InOrder(settings).running() as handler:
        await client.call("state::register-trigger", {**TRIGGER, "id": "all"})
        async with client.watch() as every, client.watch(scopes[0]) as one, \
                anyio.create_task_group() as tg:
            tg.start_soon(collect, every, events["every"], len(scopes) * ROUNDS * 3)
            tg.start_soon(collect, one, events["one"], ROUNDS * 3)
            for batch, port in ((1, away), (2, home), (3, None)):
                await write_batch(client, scopes, batch)
                if port is not None:
                    await anyio.to_thread.run_sync(redis_cluster.move_slot, slot, port)
        await until(lambda: len(handler.calls) >= len(scopes) * ROUNDS * 3, 30,
                    "every delivery")
    written = [(s, batch * 100 + n) for batch in (1, 2, 3) for s in scopes for n in range(ROUNDS)]
    assert by_scope(seen(events["every"])) == by_scope(written)
    assert seen(events["one"]) == [(s, v) for s, v in written if s == scopes[0]]
    delivered = [(body["scope"], body["new_value"]) for _, body in handler.calls]
    assert by_scope(delivered) == by_scope(written)
    assert len({call_id for call_id, _ in handler.calls}) == len(handler.calls)


async def collect(watch: Watch, into: list[Event], count: int) -> None:
    with anyio.fail_after(60):
        async for item in watch:
            if isinstance(item, Event):
                into.append(item)
                if len(into) == count:
                    return
