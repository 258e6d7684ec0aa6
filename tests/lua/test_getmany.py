"""state::get-many (getmany.lua) against real Redis: entries in request order, each exactly as
state::get-entry gives it; misses, expired keys, hashes an update left unknown, one script
call, and the request's limits: keys, each once, values in bytes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore, codec
from stateworker.context import CallContext
from stateworker.state import functions
from stateworker.state.kv import bulkread
from stateworker.state.kv.packed import unpack
from tests.lua.ttl import HOUR_MS, expiring, pass_time

pytestmark = pytest.mark.anyio


async def get_many(store: StateStore, scope: str, keys: list[str]) -> list[dict[str, Any]]:
    result = await store.call("state::get-many", {"scope": scope, "keys": keys})
    assert set(result) == {"entries"}
    entries: list[dict[str, Any]] = result["entries"]
    return entries


async def test_request_order_and_misses(store: StateStore, scope: str) -> None:
    await store.set(scope, "b", {"n": 2}, topic="t", ttl_ms=HOUR_MS)
    await store.set(scope, "a", [1, "x"])
    await store.set(scope, "é", None)
    await store.set(scope, "gone", 1)
    await store.delete(scope, "gone")
    keys = ["b", "zz", "a", "gone", "é", ""]
    entries = await get_many(store, scope, keys)
    assert [e["found"] for e in entries] == [True, False, True, False, True, False]
    assert [e.get("value") for e in entries] == [{"n": 2}, None, [1, "x"], None, None, None]
    for key, entry in zip(keys, entries, strict=True):
        assert entry == await store.call("state::get-entry", {"scope": scope, "key": key}), key
    assert entries[1] == {"found": False}
    assert entries[0]["topic"] == "t" and entries[0]["expires_at"] is not None
    assert await get_many(store, scope, []) == []
    assert await get_many(store, scope + "-empty", ["a"]) == [{"found": False}]


async def test_an_expired_entry_reads_as_a_miss(store: StateStore, scope: str) -> None:
    await store.set(scope, "live", 1, ttl_ms=HOUR_MS)
    await pass_time(await expiring(store, scope, ["dead"]))
    entries = await get_many(store, scope, ["dead", "live"])
    assert entries[0] == {"found": False}
    assert entries[1]["found"] is True and entries[1]["value"] == 1


async def test_a_hash_an_update_left_unknown_is_computed_and_stored(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "u", {"n": 1})
    await store.call("state::update", {"scope": scope, "key": "u", "ops": [
        {"type": "increment", "path": "n", "by": 2}]})
    part = store.state.keys.for_scope(scope)
    assert unpack(await store.state.conn.execute("GET", part.entry(scope, "u"))).hash is None
    entries = await get_many(store, scope, ["v", "u"])
    expected = codec.hash_tree(codec.decode_exact(b'{"n":3}'))
    assert [e.get("hash") for e in entries] == [None, expected]
    assert unpack(await store.state.conn.execute("GET", part.entry(scope, "u"))).hash == expected
    assert entries[1] == await store.call("state::get-entry", {"scope": scope, "key": "u"})


async def test_one_script_call(store: StateStore, scope: str) -> None:
    body = msgspec.json.encode({"scope": scope, "keys": [f"k{i}" for i in range(100)]})
    plan = functions.prepare(store.state, "state::get-many", body, CallContext())
    assert len(plan.commands) == 1 and plan.commands[0][0] == "FCALL"
    assert plan.commands[0][1] == store.state.library.functions["getmany"]


async def test_typed_methods(store: StateStore, scope: str) -> None:
    await store.set(scope, "a", 1)
    entries = await store.get_many(scope, ["a", "b"])
    assert [e["found"] for e in entries] == [True, False]


async def code_and_details(store: StateStore, body: dict[str, Any]) -> tuple[str, Any]:
    with pytest.raises(StateError) as caught:
        await store.call("state::get-many", body)
    return caught.value.code, caught.value.details


async def test_limits_and_refusals(store: StateStore, scope: str) -> None:
    limit = bulkread.MAX_GET_MANY
    assert len(await get_many(store, scope, [f"k{i}" for i in range(limit)])) == limit
    code, details = await code_and_details(store, {"scope": scope, "keys": ["k"] * (limit + 1)})
    assert (code, details["path"], details["limit"]) == ("INVALID_REQUEST", "$.keys", limit)
    long = "x" * (store.state.settings.max_key_bytes + 1)
    code, details = await code_and_details(store, {"scope": scope, "keys": ["a", "b", long]})
    assert (code, details["path"]) == ("KEY_TOO_LONG", "$.keys[2]")
    code, details = await code_and_details(store, {"scope": scope, "keys": ["a", 3]})
    assert (code, details["path"]) == ("INVALID_REQUEST", "$.keys[1]")
    code, details = await code_and_details(store, {"scope": scope})
    assert code == "INVALID_REQUEST"
    code, details = await code_and_details(store, {"scope": scope, "keys": [], "key": "a"})
    assert (code, details["path"]) == ("UNKNOWN_FIELD", "$.key")
    code, _ = await code_and_details(store, {"scope": "state_barrier", "keys": ["a"]})
    assert code == "RESERVED_SCOPE"


async def test_a_key_asked_again_is_read_again_and_counted_again(redis_server: Any,
                                                                  prefix: str) -> None:
    """A key asked twice is answered twice, in its places; its bytes count each time, so a
    small call asking one large value again and again is refused, not built."""
    budget = 64 * 1024
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=budget // 2, max_call_bytes=budget) as store:
        value = "x" * (budget // 4 - 2)  # its JSON: budget / 4 bytes
        await store.set("s", "k", value)
        entries = await get_many(store, "s", ["k", "nope", "k", "k", "k"])  # just the budget
        assert [e.get("value") for e in entries] == [value, None, value, value, value]
        code, details = await code_and_details(store, {"scope": "s", "keys": ["k"] * 300})
        assert (code, details) == ("CALL_TOO_LARGE", {"path": "$.keys[4]",
                                                      "size": budget + budget // 4,
                                                      "limit": budget})


async def test_the_values_read_are_bounded_by_max_call_bytes(redis_server: Any,
                                                             prefix: str) -> None:
    budget = 64 * 1024
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=budget // 2, max_call_bytes=budget) as store:
        value = "x" * (budget // 4 - 2)  # its JSON: budget / 4 bytes
        for i in range(5):
            await store.set("s", f"k{i}", value)
        entries = await get_many(store, "s", ["k0", "k1", "nope", "k2", "k3"])  # just the budget
        assert [e.get("value") for e in entries] == [value, value, None, value, value]
        code, details = await code_and_details(
            store, {"scope": "s", "keys": ["nope", "k0", "k1", "k2", "k3", "k4"]})
        assert (code, details) == ("CALL_TOO_LARGE", {"path": "$.keys[5]",
                                                      "size": budget + budget // 4,
                                                      "limit": budget})
