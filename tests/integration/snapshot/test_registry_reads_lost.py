"""The registry's own reads on a Redis that lost the prefix, and while a restore writes it
back, tried from the caller's and the operator's side: `state::list-triggers` (in process and
over the bus), `principal list` and `role list` must not answer "none" (or the built-in roles
alone) for the registrations, principals and roles PostgreSQL holds. Each is refused with
STORE_LOST naming the prefix, as the partitions' reads are; once the restore ended they give
what PostgreSQL held again."""

from __future__ import annotations

import argparse
from typing import Any

import psycopg
import pytest

from stateworker import StateStore
from stateworker.app import admin
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import StoreLost
from stateworker.keys import KeySpace
from stateworker.state import lifecycle
from stateworker.state.tenancy import principals
from tests.integration.busproto import until
from tests.integration.snapshot.test_reads_during_restore import (
    PARTITIONS,
    drop_prefix,
    held_restore,
    settings_for,
)
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

TRIGGER = {"id": "t1", "function_id": "reactor::on_change", "service": "reactor",
           "config": {"scope": "s"}}


def pg_rows(url: str, prefix: str) -> dict[str, int]:
    """How many rows of the prefix each registry table of the snapshot holds."""
    with psycopg.connect(url) as conn:
        return {table: conn.execute(f"SELECT count(*) FROM {table} WHERE prefix = %s",
                                    (prefix,)).fetchone()[0]  # type: ignore[index]
                for table in ("sw_triggers", "sw_principals", "sw_roles")}


async def registry_reads(settings: Any, call: Any) -> dict[str, Any]:
    """list-triggers through `call`, and `principal list` / `role list` as the CLI runs them
    (a state opened for the verb): each one's answer, or the StoreLost it raised."""
    got: dict[str, Any] = {}
    try:
        got["list-triggers"] = [t["id"] for t in (await call("state::list-triggers", {}))[
            "triggers"]]
    except StoreLost as exc:
        got["list-triggers"] = exc
    for verb, field in (("principal", "principals"), ("role", "roles")):
        try:
            async with lifecycle.open_state(settings=settings, reaper=False) as state:
                listed = await admin.VERBS[(verb, "list")](state, argparse.Namespace())
            got[f"{verb} list"] = sorted(r["name"] for r in listed[field]
                                         if not r.get("builtin"))
        except StoreLost as exc:
            got[f"{verb} list"] = exc
    return got


def refused(got: dict[str, Any], prefix: str, running: bool) -> None:
    wrong = {name: value for name, value in got.items() if not isinstance(value, StoreLost)}
    assert not wrong, f"registry reads answered from a Redis that lost prefix {prefix}: {wrong}"
    for exc in got.values():
        assert exc.code == "STORE_LOST" and exc.details["prefix"] == prefix
        assert ("a restore of it is running" in str(exc)) == running, str(exc)


WANT = {"list-triggers": ["t1"], "principal list": ["alice"], "role list": ["orders"]}


async def test_registry_reads_are_refused_while_redis_lost_it_and_while_it_is_restored(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store, \
            StateClient(settings=settings, timeout=30, caller="reader") as bus:
        await store.set("s", "a", 1)
        await store.call("state::register-trigger", TRIGGER)
        async with lifecycle.open_state(settings=settings, reaper=False) as state:
            await principals.add_role(state, "orders", ["read"], ["orders/*"], False, [])
            await principals.add_principal(state, "alice", ["orders"], [])
        by_store = lambda fn, body: store.call(fn, body)  # noqa: E731
        assert await registry_reads(settings, by_store) == WANT
        assert await registry_reads(settings, bus.call) == WANT
        await until(lambda: caught_up(client, keys) and pg_rows(postgres_url, prefix) == {
            "sw_triggers": 1, "sw_principals": 1, "sw_roles": 1}, 30, "the snapshot")

        drop_prefix(client, prefix)  # lost, no restore yet
        refused(await registry_reads(settings, by_store), prefix, running=False)
        refused(await registry_reads(settings, bus.call), prefix, running=False)

        async with lifecycle.open_state(settings=settings, reaper=False) as state, \
                held_restore(monkeypatch, state, postgres_url) as go_on:
            refused(await registry_reads(settings, by_store), prefix, running=True)
            refused(await registry_reads(settings, bus.call), prefix, running=True)
            await go_on()
        assert await registry_reads(settings, by_store) == WANT
        assert await registry_reads(settings, bus.call) == WANT
