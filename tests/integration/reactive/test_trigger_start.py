"""A trigger sees exactly the events committed after its registration, like an etcd watch
created now: whatever the dispatcher's positions are (no other trigger, another one, a
partition held up by a pending condition, a dispatcher that starts only later), scoped or
over every partition."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.handlers import Gate, Handler
from tests.integration.snapshots import all_dispatched
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4
ON_CHANGE = {"function_id": "reactor::on_change", "service": "reactor"}


def settings_for(redis_server: RedisServer, prefix: str) -> Settings:
    return Settings(redis_url=redis_server.url, prefix=prefix, partitions=PARTITIONS)


def settled(client: redis.Redis, prefix: str, handler: Handler) -> bool:
    """Every event dispatched, and every handler call appended received by the handler."""
    keys = KeySpace(prefix, PARTITIONS)
    stream = f"{prefix}:bus:reactor"
    appended = client.xinfo_stream(stream)["entries-added"] if client.exists(stream) else 0
    return all_dispatched(client, keys) and len(handler.calls) == appended


def changes(handler: Handler) -> list[tuple[str, str, str, Any, Any]]:
    """(trigger id, scope, key, old value, new value) of every handler call, as they came."""
    return [(call_id.split(":")[0], body["scope"], body["key"], body["old_value"],
             body["new_value"]) for call_id, body in handler.calls]


@pytest.mark.parametrize("others", ["none", "another trigger"])
async def test_a_new_trigger_gets_only_what_is_written_after_it(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str,
        others: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings) as client, \
            Handler(settings).running() as handler:
        if others != "none":
            await client.call("state::register-trigger", {
                **ON_CHANGE, "id": "other", "config": {"key": "elsewhere"}})
        await client.set(scope, "k", "v0")
        await client.call("state::register-trigger", {
            **ON_CHANGE, "id": "new", "config": {"scope": scope, "key": "k"}})
        await client.set(scope, "k", "v1")
        await until(lambda: changes(handler)[-1:] == [("new", scope, "k", "v0", "v1")], 10,
                    "the change after the registration delivered")
        await until(lambda: settled(redis_server.client(), prefix, handler), 10,
                    "every event dispatched and every call received")
        assert changes(handler) == [("new", scope, "k", "v0", "v1")]


async def test_a_partition_held_by_a_condition_does_not_replay_older_events(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    """The dispatcher is behind (the partition waits on a condition) when the trigger is
    registered: it reads the older write only after the registration, and still skips it."""
    settings = settings_for(redis_server, prefix)
    checker = Gate(settings, answer=False)
    release, asked = checker.release, checker.asked

    async with StateClient(settings=settings) as client, checker.running(), \
            Handler(settings).running() as handler:
        await client.call("state::register-trigger", {**ON_CHANGE, "id": "gated", "config": {
            "scope": scope, "key": "gate", "condition_function_id": "checker::gate",
            "condition_service": "checker", "condition_timeout_ms": 60000}})
        await client.set(scope, "gate", 1)
        with anyio.fail_after(10):
            await asked.wait()
        await client.set(scope, "k", "v0")
        await client.call("state::register-trigger", {
            **ON_CHANGE, "id": "new", "config": {"scope": scope, "key": "k"}})
        await client.set(scope, "k", "v1")
        release.set()
        await until(lambda: changes(handler)[-1:] == [("new", scope, "k", "v0", "v1")], 10,
                    "the change after the registration delivered")
        await until(lambda: settled(redis_server.client(), prefix, handler), 10,
                    "every event dispatched and every call received")
        assert changes(handler) == [("new", scope, "k", "v0", "v1")]


async def test_a_dispatcher_started_later_delivers_only_what_came_after_each_trigger(
        redis_server: RedisServer, prefix: str) -> None:
    """No dispatcher runs while the triggers are registered (its first read starts at each
    stream's beginning); a trigger over every partition and a scoped one each get exactly
    the writes after their own registration."""
    settings = settings_for(redis_server, prefix)
    keys = KeySpace(prefix, PARTITIONS)
    scopes = [next(f"s{p}-{n}" for n in range(200) if keys.partition_of(f"s{p}-{n}") == p)
              for p in range(PARTITIONS)]
    async with StateStore.open(redis_server.url, prefix=prefix,
                               partitions=PARTITIONS) as store:
        for name in scopes:
            await store.set(name, "k", "before both")
        await store.call("state::register-trigger", {**ON_CHANGE, "id": "all"})
        for name in scopes:
            await store.set(name, "k", "after all")
        await store.call("state::register-trigger", {
            **ON_CHANGE, "id": "one", "config": {"scope": scopes[1]}})
        ends = [redis_server.client().xinfo_stream(p.events)["last-generated-id"].decode()
                for p in keys.all_partitions()]
        await store.set(scopes[1], "k", "after one")
        listed = {t["id"]: t for t in (await store.call("state::list-triggers", {}))["triggers"]}
        assert listed["one"]["start_revisions"] == {"1": ends[1]}  # (its scope's partition)
        assert listed["all"]["start_revisions"].keys() == {"0", "1", "2", "3"}
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            Handler(settings).running() as handler:
        await until(lambda: settled(redis_server.client(), prefix, handler)
                    and len(handler.calls) >= 6, 10, "the dispatcher caught up")
        assert sorted(changes(handler)) == sorted(
            [("all", name, "k", "before both", "after all") for name in scopes]
            + [("all", scopes[1], "k", "after all", "after one"),
               ("one", scopes[1], "k", "after all", "after one")])
