"""What two replicas' dispatchers read when triggers change (reactive/trigger_reads.py): a
lease's renewal costs each one a read of that registration (HMGET), never every registration
(HGETALL); and after registers, unregisters, renewals and reaps each holds exactly the live
registrations, as a fresh load of them all would, in the order matching uses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from stateworker import StateStore
from stateworker.clock import now_ms
from stateworker.reactive import trigger_reads
from stateworker.reactive.dispatcher import BATCH, Dispatcher
from stateworker.reactive.matching import TriggerSet
from stateworker.state.reactive import trigger_leases
from stateworker.state.reactive.triggers import decode_trigger
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

BASE = {"function_id": "reactor::on_change", "service": "reactor"}
PADDING = {"match": [{"pointer": "/new_value/p", "equals": '"' + "x" * 1400 + '"'}]}


@asynccontextmanager
async def replicas(store: StateStore, n: int) -> AsyncIterator[list[Dispatcher]]:
    dispatchers = [Dispatcher(store.state) for _ in range(n)]
    async with anyio.create_task_group() as tg:
        for dispatcher in dispatchers:
            await tg.start(dispatcher.run)
        yield dispatchers
        for dispatcher in dispatchers:
            dispatcher.stop()


def shape(triggers: TriggerSet) -> dict[str, Any]:
    """What matching uses: each group's registrations, in order."""
    return {"any": [m.trigger for m in triggers.any_scope],
            "scoped": {s: [m.trigger for m in ms] for s, ms in triggers.by_scope.items()},
            "bus": triggers.asks_the_bus}


async def stored(store: StateStore) -> TriggerSet:
    raw = await store.state.conn.execute("HGETALL", store.state.keys.triggers)
    return TriggerSet(decode_trigger(r) for r in raw[1::2])


def commands(server: RedisServer) -> dict[str, int]:
    stats = server.client().info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0)
            for name in ("hgetall", "hmget")}


async def test_renewals_are_reread_one_by_one_not_the_whole_registry(
        own_redis: RedisServer, prefix: str) -> None:
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               reaper=False) as store, replicas(store, 2) as dispatchers:
        ids = [f"t{n}" for n in range(100)]
        for trigger_id in ids:  # ~1.6 KiB of JSON each
            await store.call("state::register-trigger", {**BASE, "id": trigger_id,
                                                         "ttl_ms": 60_000, "config": PADDING})
        await until(lambda: all(d.triggers.ids == set(ids) for d in dispatchers), 10,
                    "both replicas to load the registrations")
        own_redis.client().config_resetstat()
        renewed: dict[str, str] = {}
        for _ in range(3):
            for trigger_id in ids:
                renewed[trigger_id] = (await store.keep_trigger(trigger_id))["expires_at"]

        def current(dispatcher: Dispatcher) -> bool:
            held = dispatcher.triggers.matchers
            return all(held[i].trigger.expires_at == renewed[i] for i in ids)

        await until(lambda: all(current(d) for d in dispatchers), 10,
                    "both replicas to hold every renewal")
        read = commands(own_redis)
        assert read["hgetall"] == 0, read  # (the 300 renewals: none reread them all)
        assert read["hmget"] >= 2, read  # (each replica reread what changed)


async def test_each_replica_holds_exactly_the_live_triggers_after_every_kind_of_change(
        own_redis: RedisServer, prefix: str) -> None:
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               reaper=False) as store, replicas(store, 2) as dispatchers:
        for n in range(40):
            config = {"scope": f"s{n % 3}"} if n % 2 else {}
            await store.call("state::register-trigger", {**BASE, "id": f"t{n:02}",
                                                         "ttl_ms": 60_000, "config": config})
        for n in range(0, 40, 5):
            await store.unregister_trigger(f"t{n:02}")
        for n in range(1, 40, 5):
            await store.keep_trigger(f"t{n:02}", ttl_ms=3_600_000)
        for n in range(2, 40, 5):
            await store.keep_trigger(f"t{n:02}", ttl_ms=500)
        for n in range(3, 40, 5):  # replaced: another scope, or none
            await store.call("state::register-trigger", {**BASE, "id": f"t{n:02}",
                                                         "config": {"scope": "s9"}})
        await store.call("state::register-trigger", {**BASE, "id": "t99"})
        short = now_ms() + 500
        await until(lambda: now_ms() > short, 10, "the short leases to expire")
        assert await trigger_leases.reap_triggers(store.state) == 8

        want = await stored(store)
        assert len(want.ids) == 40 - 8 - 8 + 1

        async def same() -> bool:
            return all(shape(d.triggers) == shape(want) for d in dispatchers)

        await until(same, 10, "both replicas to hold exactly the registrations")


async def test_after_redis_lost_the_registry_and_began_anew_no_lost_trigger_is_held(
        own_redis: RedisServer, prefix: str) -> None:
    """A Redis wiped with no PostgreSQL snapshot begins the prefix anew, empty: the triggers
    it held are gone (list-triggers says none), so no replica may go on matching events
    against them, though the next change names one new trigger alone."""
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               reaper=False) as store, replicas(store, 2) as dispatchers:
        old = [f"t{n}" for n in range(10)]
        for trigger_id in old:
            await store.call("state::register-trigger", {**BASE, "id": trigger_id})
        await until(lambda: all(d.triggers.ids == set(old) for d in dispatchers), 10,
                    "both replicas to load the registrations")
        client = own_redis.client()
        client.flushall()
        await until(lambda: client.exists(store.state.keys.registry_marker), 10,
                    "the prefix begun anew in the wiped Redis")
        assert (await store.call("state::list-triggers", {}))["triggers"] == []
        await store.call("state::register-trigger", {**BASE, "id": "n1"})
        fresh = shape(await stored(store))
        await until(lambda: all("n1" in d.triggers.ids for d in dispatchers), 10,
                    "both replicas to load the new registration")
        for dispatcher in dispatchers:
            assert dispatcher.triggers.ids == {"n1"}
            assert shape(dispatcher.triggers) == fresh


async def test_registry_entries_trimmed_before_they_were_read_mean_every_trigger_is_read_again(
        own_redis: RedisServer, prefix: str) -> None:
    """A dispatcher that fell behind the registry's MAXLEN: the entries it reads no longer
    name every change since its last read (an unregister was trimmed away), so it must read
    every registration again, not only the ids it was shown."""
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        state = store.state
        for n in range(10):
            await store.call("state::register-trigger", {**BASE, "id": f"t{n}"})
        ((after, _),) = await state.conn.execute("XREVRANGE", state.keys.registry, "+", "-",
                                                 "COUNT", 1)
        await store.unregister_trigger("t1")  # the change the trimming takes away
        await store.call("state::register-trigger", {**BASE, "id": "t20"})
        since = f"({after.decode()}"
        entries = await state.conn.execute("XRANGE", state.keys.registry, since, "+")
        whole = await trigger_reads.changed(state, entries, after.decode(), 10, BATCH)
        assert whole is not None and whole["t1"] is None and list(whole) == ["t1", "t20"]
        kept = entries[-1][0]
        await state.conn.execute("XTRIM", state.keys.registry, "MINID", kept)
        entries = await state.conn.execute("XRANGE", state.keys.registry, since, "+")
        assert [entry[0] for entry in entries] == [kept]  # (t1's unregister is gone)
        assert await trigger_reads.changed(state, entries, after.decode(), 10, BATCH) is None
