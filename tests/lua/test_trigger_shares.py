"""Each owner's share of the trigger registry (trigger.lua, keeptrigger.lua, lua/includes/
shares.lua): a principal holds at most MAX_OWNER_TRIGGERS registrations and
MAX_OWNER_TRIGGERS_BYTES of their JSON, so one principal with the `triggers` grant cannot
leave the others none; the share frees as it unregisters or its leases expire (and are
reaped), and after a restore from PostgreSQL it is counted from the registrations restored."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
import pytest

from stateworker import StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.settings import Settings
from stateworker.state import functions
from stateworker.state.reactive import trigger_leases
from stateworker.state.reactive.trigger_checks import MAX_OWNER_TRIGGERS, MAX_OWNER_TRIGGERS_BYTES
from tests.calls import principal as make_principal
from tests.integration.busproto import until
from tests.integration.snapshot.test_restore import restore_command
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

BASE = {"function_id": "reactor::on_change", "service": "reactor"}


async def call(store: StateStore, principal: str, fn: str, body: dict[str, Any]) -> Any:
    raw = await functions.call_json(store.state, fn, msgspec.json.encode(body),
                                    CallContext(principal=principal), store.catalog)
    return msgspec.json.decode(raw)


async def refused(store: StateStore, principal: str, body: dict[str, Any]) -> StateError:
    with pytest.raises(StateError) as caught:
        await call(store, principal, "state::register-trigger", body)
    return caught.value


async def register_many(store: StateStore, principal: str, count: int,
                        **extra: Any) -> None:
    for n in range(count):
        await call(store, principal, "state::register-trigger",
                   {**BASE, "id": f"{principal}-{n}", **extra})


async def principals(store: StateStore, *names: str) -> None:
    for name in names:
        await make_principal(store, name, allow=("read", "triggers"), services=("reactor",))


async def test_an_owner_at_its_share_is_refused_while_another_registers_and_it_frees(
        redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        await principals(store, "greedy", "other")
        await register_many(store, "greedy", MAX_OWNER_TRIGGERS - 2)
        for n in ("lease-a", "lease-b"):  # its last two leased, for half a second
            await call(store, "greedy", "state::register-trigger",
                       {**BASE, "id": f"greedy-{n}", "ttl_ms": 500})

        error = await refused(store, "greedy", {**BASE, "id": "greedy-more"})
        assert error.code == "INVALID_REQUEST"
        assert error.details == {"path": "$.id", "limit": MAX_OWNER_TRIGGERS, "of": "owner",
                                 "owner": "greedy"}
        assert error.message == (f'$.id: principal "greedy" has {MAX_OWNER_TRIGGERS} triggers '
                                 f"registered, the limit is {MAX_OWNER_TRIGGERS} an owner; "
                                 "unregister some of its own first")
        # Another principal registers still; replacing one of its own is no new one.
        await call(store, "other", "state::register-trigger", {**BASE, "id": "other-1"})
        await call(store, "greedy", "state::register-trigger",
                   {**BASE, "id": "greedy-0", "config": {"key": "k"}})

        # An unregister frees one place, and one only.
        await call(store, "greedy", "state::unregister-trigger", {"id": "greedy-1"})
        await call(store, "greedy", "state::register-trigger", {**BASE, "id": "greedy-more"})
        assert (await refused(store, "greedy", {**BASE, "id": "greedy-x"})).details["of"] \
            == "owner"

        # Expired leases free theirs once reaped.
        until_ms = now_ms() + 500
        await until(lambda: now_ms() > until_ms, 10, "the leases to expire")
        assert await trigger_leases.reap_triggers(store.state) == 2
        for n in ("x", "y"):
            await call(store, "greedy", "state::register-trigger", {**BASE, "id": f"greedy-{n}"})
        assert (await refused(store, "greedy", {**BASE, "id": "greedy-z"})).details["of"] \
            == "owner"


async def test_an_owner_past_its_share_of_bytes_is_refused_naming_its_limit(
        redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        await principals(store, "big", "other")
        padding = {"match": [{"pointer": "/new_value/p", "equals": "x" * 60_000}]}
        held, error = 0, None
        while error is None:  # ~60 KiB each, until the share is full
            try:
                await call(store, "big", "state::register-trigger",
                           {**BASE, "id": f"big-{held}", "config": padding})
                held += 1
            except StateError as refusal:
                error = refusal
        assert held * 60_000 <= MAX_OWNER_TRIGGERS_BYTES < (held + 1) * 61_000
        assert error.code == "INVALID_REQUEST"
        assert error.details["path"] == "$.config" and error.details["of"] == "owner"
        assert error.details["owner"] == "big"
        assert error.details["limit"] == MAX_OWNER_TRIGGERS_BYTES
        assert error.details["size"] > MAX_OWNER_TRIGGERS_BYTES
        assert error.message.startswith(f'$.config: principal "big"\'s registrations would hold '
                                        f"{error.details['size']} bytes of JSON")
        await call(store, "other", "state::register-trigger",
                   {**BASE, "id": "other-big", "config": padding})
        await call(store, "big", "state::unregister-trigger", {"id": "big-0"})
        await call(store, "big", "state::register-trigger",
                   {**BASE, "id": "big-again", "config": padding})


async def test_after_a_restore_each_owners_share_is_counted_from_what_came_back(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url)
    redis = own_redis.client()
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        store = StateStore(service.state)
        await principals(store, "greedy", "other")
        await register_many(store, "greedy", MAX_OWNER_TRIGGERS - 1)
        await register_many(store, "other", 3)
        await until(lambda: count_in_postgres(postgres_url, prefix) == MAX_OWNER_TRIGGERS + 2,
                    60, "the registrations in PostgreSQL")
    redis.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        await call(store, "greedy", "state::register-trigger", {**BASE, "id": "greedy-last"})
        error = await refused(store, "greedy", {**BASE, "id": "greedy-more"})
        assert error.details["of"] == "owner" and error.details["owner"] == "greedy"
        await call(store, "other", "state::register-trigger", {**BASE, "id": "other-more"})


def count_in_postgres(postgres_url: str, prefix: str) -> int:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT count(*) FROM sw_triggers WHERE prefix = %s",
                           (prefix,)).fetchone()
    return int(row[0]) if row else 0

