"""Reads of a prefix whose Redis lost its data, before and while `stateworker restore` brings
it back from PostgreSQL, tried from the caller's side: a key PostgreSQL holds must never read
as absent because Redis has not loaded it (yet). Every read function, in process and over the
bus, is refused with STORE_LOST naming the prefix; once the restore ended the same reads give
the values PostgreSQL held; another prefix on the same Redis reads on unaffected throughout."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import StoreLost
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.snapshot import paged
from stateworker.snapshot import restore as restoring
from stateworker.state import lifecycle
from tests.integration.busproto import until
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4
VALUES = {"a": {"n": 1}, "b": {"n": 2}, "c": {"n": 3}}
WHERE = [{"pointer": "/n", "op": "gte", "value": 1}]

# Every read function with a body reading scope "s" (or every scope), and what it gives once
# the data is back: each must be refused while it is not.
READS: dict[str, tuple[str, dict[str, Any], Callable[[Any], Any]]] = {
    "get": ("state::get", {"scope": "s", "key": "b"}, lambda r: r),
    "get-entry": ("state::get-entry", {"scope": "s", "key": "b"}, lambda r: r.get("value")),
    "get-many": ("state::get-many", {"scope": "s", "keys": ["a", "b", "c"]},
                 lambda r: [e.get("value") for e in r["entries"]]),
    "list": ("state::list", {"scope": "s"}, lambda r: r),
    "list_keys": ("state::list_keys", {"scope": "s"}, lambda r: r["keys"]),
    "list_groups": ("state::list_groups", {}, lambda r: r["groups"]),
    "list-entries": ("state::list-entries", {"scope": "s", "include_values": True},
                     lambda r: [e.get("value") for e in r["entries"]]),
    "list_entries": ("state::list_entries", {"scope": "s"}, lambda r: r["entries"]),
    "query": ("state::query", {"scope": "s", "where": WHERE},
              lambda r: [e.get("value") for e in r["entries"]]),
    "query by index": ("state::query", {"scope": "i", "where": WHERE},
                       lambda r: [e.get("value") for e in r["entries"]]),
    "list-indexes": ("state::list-indexes", {"scope": "i"}, lambda r: r),
}
EXPECTED: dict[str, Any] = {
    "get": {"n": 2}, "get-entry": {"n": 2}, "get-many": list(VALUES.values()),
    "list": list(VALUES.values()), "list_keys": list(VALUES), "list_groups": ["i", "s"],
    "list-entries": list(VALUES.values()), "list_entries": [[k, v] for k, v in VALUES.items()],
    "query": list(VALUES.values()), "query by index": list(VALUES.values()),
}


def settings_for(url: str, prefix: str, postgres_url: str | None) -> Settings:
    return Settings(redis_url=url, prefix=prefix, partitions=PARTITIONS,
                    postgres_url=postgres_url, lease_ms=1000)


async def seeded(store: StateStore) -> None:
    for key, value in VALUES.items():
        await store.set("s", key, value)
        await store.set("i", key, value)
    await store.call("state::create-index", {"scope": "i", "pointer": "/n"})


def drop_prefix(client: redis.Redis, prefix: str) -> None:
    """The prefix's data lost, as a FLUSHALL would lose it (another prefix's kept)."""
    names = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    assert names
    client.delete(*names)


ReadAll = Callable[[], Awaitable[dict[str, Any]]]


def reader(call: Callable[..., Awaitable[Any]]) -> ReadAll:
    """Every read of READS through `call`: each one's result, or the StoreLost it raised."""
    async def read_all() -> dict[str, Any]:
        got: dict[str, Any] = {}
        for name, (fn, body, shown) in READS.items():
            try:
                got[name] = shown(await call(fn, body))
            except StoreLost as exc:
                got[name] = exc
        return got

    return read_all


def refused(got: dict[str, Any], prefix: str, running: bool) -> None:
    """Each read refused with STORE_LOST, naming the prefix and what it waits for."""
    wrong = {name: value for name, value in got.items() if not isinstance(value, StoreLost)}
    assert not wrong, f"reads answered from a Redis that lost prefix {prefix}: {wrong}"
    for exc in got.values():
        assert exc.code == "STORE_LOST"
        assert exc.details["prefix"] == prefix
        text = str(exc)
        assert prefix in text
        assert ("a restore of it is running" in text) == running, text


def answered(got: dict[str, Any]) -> None:
    for name, want in EXPECTED.items():
        assert got[name] == want, name
    assert got["list-indexes"]["indexes"][0]["pointer"] == "/n"


@asynccontextmanager
async def held_restore(monkeypatch: pytest.MonkeyPatch, state: Any, postgres_url: str
                       ) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """A restore held after it wrote its first entry back (one row a batch): yields, while
    held, the way to let it go on (which returns its summary)."""
    paused, go = anyio.Event(), anyio.Event()
    run = restoring._run
    summary: list[Any] = []

    async def held(state: Any, commands: list[list[Any]]) -> list[Any]:
        replies = await run(state, commands)
        if commands and commands[0][0] == "SET" and not paused.is_set():
            paused.set()
            await go.wait()
        return replies

    monkeypatch.setattr(paged, "PAGE_ROWS", 1)
    monkeypatch.setattr(restoring, "_run", held)

    async def go_on() -> Any:
        go.set()
        with anyio.fail_after(30):
            while not summary:
                await anyio.sleep(0.005)  # (polling the task's result)
        return summary[0]

    async with anyio.create_task_group() as tg:
        async def restore() -> None:
            summary.append(await restoring.restore(state, postgres_url))

        tg.start_soon(restore)
        with anyio.fail_after(30):
            await paused.wait()
        yield go_on


async def test_reads_are_refused_while_redis_lost_the_prefix_and_while_it_is_restored(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    other = settings_for(own_redis.url, f"{prefix}o", None)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(settings=settings) as store, \
            StateClient(settings=settings, timeout=30, caller="reader") as bus, \
            StateStore.open(settings=other) as bystander:
        await seeded(store)
        await seeded(bystander)
        by_store = reader(lambda fn, body: store.call(fn, body, caller="reader"))
        by_bystander = reader(lambda fn, body: bystander.call(fn, body, caller="reader"))
        by_bus = reader(bus.call)
        answered(await by_store())
        answered(await by_bus())
        await until(lambda: caught_up(client, keys), 30, "the snapshot")

        drop_prefix(client, prefix)  # lost, no restore yet
        refused(await by_store(), prefix, running=False)
        refused(await by_bus(), prefix, running=False)
        answered(await by_bystander())

        async with lifecycle.open_state(settings=settings, reaper=False) as state, \
                held_restore(monkeypatch, state, postgres_url) as go_on:
            assert client.exists(keys.for_scope("s").entry("s", "b")) + \
                client.exists(keys.for_scope("s").entry("s", "a")) <= 1  # (half way)
            refused(await by_store(), prefix, running=True)
            refused(await by_bus(), prefix, running=True)
            answered(await by_bystander())
            assert (await go_on()).entries == 2 * len(VALUES) + 1  # (+ the index's definition)
        answered(await by_store())
        await until(lambda: service.state.lost is None, 30, "the service found it restored")
        answered(await by_bus())
