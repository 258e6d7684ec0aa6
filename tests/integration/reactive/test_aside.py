"""A full target's trigger is set aside; its partition goes on (docs/decisions/0067).

One trigger whose target nobody serves must not hold up the other triggers of its partition:
it is set aside at the event its target was full for (a mark in `<partition>:aside`), the
others go on, and once its target has room it is caught up alone, in order, each event
once. The mark survives a kill -9, goes with its trigger, and holds trimming back (the cap's
cut counted for that trigger)."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aredis

from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, bus_stream
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.services import settings_for
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

BACKLOG, WRITES = 5, 20


def scopes_in_one_partition(prefix: str, scope: str, count: int) -> list[str]:
    """`count` scopes of one partition (of 4), the first `scope`."""
    keys = KeySpace(prefix, 4)
    found = [scope]
    n = 0
    while len(found) < count:
        n += 1
        if keys.partition_of(f"{scope}-{n}") == keys.partition_of(scope):
            found.append(f"{scope}-{n}")
    return found


async def register(store: StateStore, trigger_id: str, service: str, scope: str) -> None:
    await store.call("state::register-trigger", {
        "id": trigger_id, "function_id": f"{service}::on_change", "service": service,
        "config": {"scope": scope}})


async def trigger_row(settings: Settings, trigger_id: str) -> dict[str, Any]:
    rows = (await status_report(settings))["triggers"]
    return next(row for row in rows if row["id"] == trigger_id)


async def marks(raw: aredis.Redis, prefix: str, scope: str) -> dict[bytes, bytes]:
    part = KeySpace(prefix, 4).for_scope(scope)
    return dict(await raw.hgetall(part.aside))


def keys_of(handler: Handler) -> list[str]:
    return handler.delivered_keys()


def runs(handler: Handler) -> collections.Counter[str]:
    return collections.Counter(call_id for call_id, _ in handler.calls)


@asynccontextmanager
async def attacked(redis_server: RedisServer, prefix: str, scope: str, **extra: Any
                   ) -> AsyncIterator[tuple[Settings, StateStore, list[str]]]:
    """A service with the backlog BACKLOG; trigger `a` on the first scope calling `dead`
    (nobody serves it), `b` on the second, of the same partition, calling `reactor`."""
    settings = settings_for(redis_server, prefix, trigger_backlog=BACKLOG, **extra)
    scopes = scopes_in_one_partition(prefix, scope, 3)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                            reaper=False, **extra) as store:
        assert service.dispatcher is not None
        await register(store, "a", "dead", scopes[0])
        await register(store, "b", "reactor", scopes[1])
        await until(lambda: service.dispatcher.triggers.ids == {"a", "b"}, 10, "the triggers")
        yield settings, store, scopes


async def test_a_dead_target_holds_up_only_its_own_trigger(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    dead = bus_stream(prefix, "dead")
    async with attacked(redis_server, prefix, scope) as (settings, store, scopes), \
            Handler(settings).running() as theirs:
        for n in range(WRITES):
            await store.set(scopes[0], f"k{n:02}", n)  # the attacker's
            await store.set(scopes[1], f"k{n:02}", n)  # the other principal's
        await until(lambda: len(theirs.calls) == WRITES, 30, "b served every event")
        assert keys_of(theirs) == [f"k{n:02}" for n in range(WRITES)]
        assert await raw.xlen(dead) == BACKLOG
        assert set(await marks(raw, prefix, scopes[0])) == {b"a"}
        row = await trigger_row(settings, "a")
        assert row["aside"] is not None and row["lag_events"] == 2 * WRITES - 2 * BACKLOG

        async with Handler(settings, service="dead").running() as mine:
            await until(lambda: len(mine.calls) == WRITES, 30, "a caught up")

            async def rejoined() -> bool:
                return not await marks(raw, prefix, scopes[0])

            await until(rejoined, 30, "a's mark dropped")
            await store.set(scopes[0], "after", 1)  # (a in the main pass again)
            await until(lambda: len(mine.calls) == WRITES + 1, 30, "a's next event")
        assert keys_of(mine) == [f"k{n:02}" for n in range(WRITES)] + ["after"]
        assert set(runs(mine).values()) == {1} and set(runs(theirs).values()) == {1}
        assert (await trigger_row(settings, "a"))["aside"] is None


async def test_a_set_aside_trigger_survives_a_kill_9(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix, trigger_backlog=BACKLOG)
    env = {"STATEWORKER_LEASE_MS": "1000", "STATEWORKER_TRIGGER_BACKLOG": str(BACKLOG)}
    scopes = scopes_in_one_partition(prefix, scope, 2)
    process = ServiceProcess(redis_server.url, prefix, env=env)
    process.start()
    try:
        async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                                   reaper=False) as store, \
                Handler(settings).running() as theirs:
            await register(store, "a", "dead", scopes[0])
            await register(store, "b", "reactor", scopes[1])
            for n in range(WRITES):
                await store.set(scopes[0], f"k{n:02}", n)
                await store.set(scopes[1], f"k{n:02}", n)
            await until(lambda: len(theirs.calls) == WRITES, 30, "b served every event")

            async def waits() -> bool:  # (as status shows it: the dispatcher's figures)
                return (await trigger_row(settings, "a"))["waiting_on"] is not None

            await until(waits, 30, "a waiting on its target")
            process.kill()
            for n in range(WRITES, 2 * WRITES):  # (while no one dispatches)
                await store.set(scopes[0], f"k{n:02}", n)
                await store.set(scopes[1], f"k{n:02}", n)
            process.start()
            await until(lambda: len(theirs.calls) >= 2 * WRITES, 30, "b after the restart")
            async with Handler(settings, service="dead").running() as mine:
                await until(lambda: len(mine.calls) >= 2 * WRITES, 30, "a caught up")

                async def rejoined() -> bool:
                    return not await marks(raw, prefix, scopes[0])

                await until(rejoined, 30, "a's mark dropped")
            wanted = [f"k{n:02}" for n in range(2 * WRITES)]
            assert keys_of(mine) == wanted and keys_of(theirs) == wanted
            assert set(runs(mine).values()) == {1} and set(runs(theirs).values()) == {1}
    finally:
        process.kill()


async def test_an_unregistered_set_aside_triggers_mark_is_dropped(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    dead = bus_stream(prefix, "dead")
    async with attacked(redis_server, prefix, scope) as (settings, store, scopes), \
            Handler(settings).running() as theirs:
        for n in range(WRITES):
            await store.set(scopes[0], f"k{n:02}", n)
        await until(lambda: raw.xlen(dead), 30, "a's calls")

        async def set_aside() -> bool:
            return bool(await marks(raw, prefix, scopes[0]))

        await until(set_aside, 30, "a set aside")
        await store.call("state::unregister-trigger", {"id": "a"})

        async def dropped() -> bool:
            return not await marks(raw, prefix, scopes[0])

        await until(dropped, 30, "a's mark dropped")
        async with Handler(settings, service="dead").running() as mine:
            await until(lambda: len(mine.calls) == BACKLOG, 30, "what a's stream held")
            await store.set(scopes[0], "after", 1)
            await store.set(scopes[1], "after", 1)  # (a pass of the partition after it)
            await until(lambda: len(theirs.calls) == 1, 30, "b's event")
            assert len(mine.calls) == BACKLOG  # (no catch-up: nothing more for a)
        per_trigger = await raw.hgetall(f"{prefix}:dispatch:by_trigger")
        assert not [f for f in per_trigger if f.startswith(b"a|")]


async def test_a_mark_holds_trimming_back(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    async with attacked(redis_server, prefix, scope, events_retain=0) as (
            settings, store, scopes):
        events = KeySpace(prefix, 4).for_scope(scopes[0]).events
        await store.call("state::on-config-change", {"triggers_enabled": False})
        for n in range(150):  # (no trigger's: trimmed once passed)
            await store.set(scopes[2], f"x{n}", n)
        first = (await raw.xrange(events, count=1))[0][0]
        for n in range(WRITES):
            await store.set(scopes[0], f"k{n:02}", n)
        for n in range(150):
            await store.set(scopes[2], f"y{n}", n)
        await store.call("state::on-config-change", {"triggers_enabled": None})

        async def trimmed() -> bool:
            return (await raw.xrange(events, count=1))[0][0] != first

        await until(trimmed, 30, "the passed events trimmed")
        ((field, mark),) = (await marks(raw, prefix, scopes[0])).items()
        mark_id, n = mark.decode().split()
        assert field == b"a" and int(n) == 150 + BACKLOG
        info = await raw.xinfo_stream(events)
        kept = await raw.xrange(events, f"({mark_id}", "+")
        assert len(kept) == info["entries-added"] - int(n) == WRITES - BACKLOG + 150
        async with Handler(settings, service="dead").running() as mine:
            await until(lambda: len(mine.calls) == WRITES, 30, "a caught up")
        assert keys_of(mine) == [f"k{n:02}" for n in range(WRITES)]


async def test_the_caps_cut_after_a_mark_is_counted_for_its_trigger(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    async with attacked(redis_server, prefix, scope, events_maxlen=100) as (
            settings, store, scopes):
        events = KeySpace(prefix, 4).for_scope(scopes[0]).events
        for n in range(WRITES):
            await store.set(scopes[0], f"k{n:02}", n)

        async def set_aside() -> bool:
            return bool(await marks(raw, prefix, scopes[0]))

        await until(set_aside, 30, "a set aside")
        for n in range(1000):  # (past the cap: a's events after its mark cut)
            await store.set(scopes[2], f"x{n}", n)
        info = await raw.xinfo_stream(events)
        cut = info["entries-added"] - info["length"] - BACKLOG
        assert cut >= WRITES - BACKLOG

        async def counted() -> bool:
            return (await trigger_row(settings, "a"))["cut_events"] == cut

        await until(counted, 30, "the cut counted for a")
        async with Handler(settings, service="dead").running() as mine:
            async def rejoined() -> bool:
                return not await marks(raw, prefix, scopes[0])

            await until(rejoined, 30, "a's mark dropped")
            assert keys_of(mine) == [f"k{n:02}" for n in range(BACKLOG)]
