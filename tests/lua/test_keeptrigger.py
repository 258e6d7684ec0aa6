"""Leased triggers (keeptrigger.lua, trigger.lua): `ttl_ms` on state::register-trigger, renewed
by state::keep-trigger; once expired a trigger is gone at once (list-triggers, keep-trigger,
unregister), before the reaper removes it, and the reaper removes it from Redis and tells
every replica through the registry stream."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.clock import epoch_ms, now_ms
from stateworker.context import CallContext
from stateworker.state import functions
from stateworker.state.reactive import trigger_leases
from tests.calls import principal as make_principal
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

BASE = {"function_id": "reactor::on_change", "service": "reactor"}


async def refused(store: StateStore, fn: str, body: dict[str, Any]) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call(fn, body)
    return caught.value


async def listed(store: StateStore) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in (await store.call("state::list-triggers", {}))["triggers"]}


@pytest.mark.parametrize("ttl_ms", [0, -1, 499, 86_400_001])
async def test_a_ttl_out_of_range_is_refused_naming_the_field_and_limits(
        store: StateStore, ttl_ms: int) -> None:
    for fn, body in [("state::register-trigger", {**BASE, "id": "t", "ttl_ms": ttl_ms}),
                     ("state::keep-trigger", {"id": "t", "ttl_ms": ttl_ms})]:
        error = await refused(store, fn, body)
        assert error.code == "INVALID_REQUEST"
        assert error.details == {"path": "$.ttl_ms", "limit": 86_400_000}
        assert error.message == (f"$.ttl_ms: must be between 500 and 86400000 ms, got {ttl_ms}")
    assert await listed(store) == {}
    wrong = await refused(store, "state::register-trigger", {**BASE, "ttl_ms": "1000"})
    assert wrong.code == "INVALID_REQUEST" and "ttl_ms" in wrong.message


async def test_keep_trigger_renews_the_lease_and_list_triggers_shows_it(
        store: StateStore) -> None:
    before = now_ms()
    await store.call("state::register-trigger", {**BASE, "id": "lease", "ttl_ms": 60_000})
    await store.call("state::register-trigger", {**BASE, "id": "plain"})
    after = now_ms()
    triggers = await listed(store)
    assert "ttl_ms" not in triggers["plain"] and "expires_at" not in triggers["plain"]
    assert triggers["lease"]["ttl_ms"] == 60_000
    first = epoch_ms(triggers["lease"]["expires_at"])
    assert before + 60_000 <= first <= after + 60_000

    kept = await store.keep_trigger("lease", ttl_ms=3_600_000)  # this renewal's lifetime
    assert set(kept) == {"id", "expires_at"} and kept["id"] == "lease"
    assert epoch_ms(kept["expires_at"]) >= before + 3_600_000
    triggers = await listed(store)
    assert triggers["lease"]["expires_at"] == kept["expires_at"]
    assert triggers["lease"]["ttl_ms"] == 60_000  # the registration's own ttl stays
    start = now_ms()
    again = await store.call("state::keep-trigger", {"id": "lease"})  # its own ttl_ms
    assert start + 60_000 <= epoch_ms(again["expires_at"]) <= now_ms() + 60_000
    assert {k: v for k, v in triggers["lease"].items() if k != "expires_at"} == \
        {k: v for k, v in (await listed(store))["lease"].items() if k != "expires_at"}


async def test_keep_trigger_of_an_unknown_or_unleased_trigger_is_refused(
        store: StateStore) -> None:
    unknown = await refused(store, "state::keep-trigger", {"id": "nobody"})
    assert unknown.code == "NOT_FOUND"
    assert unknown.details == {"path": "$.id", "id": "nobody"}
    assert unknown.message.startswith('$.id: no trigger "nobody" is registered')
    await store.call("state::register-trigger", {**BASE, "id": "plain"})
    unleased = await refused(store, "state::keep-trigger", {"id": "plain"})
    assert unleased.code == "INVALID_REQUEST" and unleased.details["path"] == "$.id"
    assert 'trigger "plain" was registered without ttl_ms' in unleased.message
    assert "expires_at" not in (await listed(store))["plain"]


async def test_an_expired_trigger_is_gone_at_once_then_reaped(
        redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        keys, client = store.state.keys, redis_server.client()
        for name in ("a", "b"):
            await store.call("state::register-trigger", {**BASE, "id": name, "ttl_ms": 500})
        await store.call("state::register-trigger", {**BASE, "id": "plain"})
        expires = max(epoch_ms(t["expires_at"]) for t in (await listed(store)).values()
                      if "expires_at" in t)
        await until(lambda: now_ms() > expires, 10, "the leases to expire")

        # Gone at once, while still stored (nothing reaped it yet).
        assert list(await listed(store)) == ["plain"]
        assert client.hexists(keys.triggers, "a") and client.hexists(keys.triggers, "b")
        gone = await refused(store, "state::keep-trigger", {"id": "a"})
        assert gone.code == "NOT_FOUND" and gone.details["id"] == "a"
        registry = client.xlen(keys.registry)
        assert await store.unregister_trigger("a") == {"id": "a", "removed": False}
        assert not client.hexists(keys.triggers, "a")  # (removed on the way, and told)
        assert client.xlen(keys.registry) == registry + 1

        # The reaper removes the rest, index and registration, one registry entry each.
        assert await trigger_leases.reap_triggers(store.state) == 1
        assert not client.hexists(keys.triggers, "b")
        assert client.zcard(keys.trigger_leases) == 0
        last = client.xrevrange(keys.registry, count=1)[0][1]
        assert last == {b"kind": b"triggers", b"id": b"b"}
        assert await trigger_leases.reap_triggers(store.state) == 0
        assert list(await listed(store)) == ["plain"]

        # The id registers again, as a new trigger.
        await store.call("state::register-trigger", {**BASE, "id": "a", "ttl_ms": 60_000})
        assert sorted(await listed(store)) == ["a", "plain"]
        await store.call("state::register-trigger", {**BASE, "id": "a"})  # now unleased
        assert client.zcard(keys.trigger_leases) == 0


async def test_in_acl_mode_only_the_owner_or_an_admin_keeps_a_trigger(
        store: StateStore) -> None:
    async def call(principal: str, fn: str, body: dict[str, Any]) -> Any:
        raw = await functions.call_json(store.state, fn, msgspec.json.encode(body),
                                        CallContext(principal=principal), store.catalog)
        return msgspec.json.decode(raw)

    await make_principal(store, "ops", allow=("read", "triggers"), services=("reactor",))
    await make_principal(store, "mallory", allow=("read", "triggers"), services=("reactor",))
    await make_principal(store, "root", "admin")
    await call("ops", "state::register-trigger", {**BASE, "id": "t1", "ttl_ms": 60_000})
    with pytest.raises(StateError) as denied:
        await call("mallory", "state::keep-trigger", {"id": "t1"})
    assert denied.value.code == "PERMISSION_DENIED"
    assert denied.value.details["owner"] == "ops"
    assert denied.value.details["principal"] == "mallory"
    assert denied.value.message.startswith(
        '$.id: trigger "t1" is principal "ops"\'s; principal "mallory" keeps only its own')
    assert set(await call("ops", "state::keep-trigger", {"id": "t1"})) == {"id", "expires_at"}
    assert set(await call("root", "state::keep-trigger", {"id": "t1"})) == {"id", "expires_at"}
