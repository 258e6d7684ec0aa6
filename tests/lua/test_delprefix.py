"""state::delete-by-prefix (delprefix.lua) against real Redis: exactly the keys with the byte
prefix, at most `limit` per call in key order, `more` until none is left, one state:deleted
event per entry, expired entries deleted with the reaper's event, and the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateError, StateStore
from stateworker.state.kv import bulkread
from tests.lua.ttl import HOUR_MS, expiring, pass_time

pytestmark = pytest.mark.anyio


async def delete(store: StateStore, scope: str, prefix: str, **more: Any) -> dict[str, Any]:
    result: dict[str, Any] = await store.call(
        "state::delete-by-prefix", {"scope": scope, "prefix": prefix, **more})
    return result


async def test_batches_in_key_order_until_done(store: StateStore, scope: str) -> None:
    keys = [f"job:{i:03d}" for i in range(10)]
    for i, key in enumerate(keys):
        await store.set(scope, key, {"i": i}, topic="t" if i % 2 else None)
    for key in ("job", "job;", "jo", "other:1", "jobs"):
        await store.set(scope, key, key)
    after = (await store.events(scope))[-1].revision
    assert await delete(store, scope, "job:", limit=4) == {"deleted": 4, "more": True}
    assert await store.list_keys(scope) == sorted([*keys[4:], "job", "job;", "jo", "other:1",
                                                   "jobs"])
    assert await delete(store, scope, "job:", limit=4) == {"deleted": 4, "more": True}
    assert await delete(store, scope, "job:", limit=4) == {"deleted": 2, "more": False}
    assert await delete(store, scope, "job:", limit=4) == {"deleted": 0, "more": False}
    assert await store.list_keys(scope) == ["jo", "job", "job;", "jobs", "other:1"]
    events = await store.events(scope, after)
    assert [(e.type, e.key, e.version, bytes(e.new_value)) for e in events] == \
        [("state:deleted", key, 1, b"null") for key in keys]
    assert [bytes(e.old_value) for e in events] == [f'{{"i":{i}}}'.encode() for i in range(10)]
    # the indexes lost them too
    page = await store.call("state::list-entries", {"scope": scope, "order_by": "topic"})
    assert [e["key"] for e in page["entries"]] == ["jo", "job", "job;", "jobs", "other:1"]


async def test_an_exact_limit_says_more_only_when_some_remain(store: StateStore,
                                                              scope: str) -> None:
    for key in ("p1", "p2", "q"):
        await store.set(scope, key, 1)
    assert await delete(store, scope, "p", limit=2) == {"deleted": 2, "more": False}
    assert await delete(store, scope, "q", limit=1) == {"deleted": 1, "more": False}
    assert await store.list_groups() == []  # the scope's last entry went: it is no group


async def test_a_byte_prefix_that_is_no_utf8_boundary(store: StateStore, scope: str) -> None:
    # "é" is C3 A9 and "ê" C3 AA: they share a byte, but a prefix is text
    for key in ("é", "éa", "ê", "êb", "e", "f\u00ff", "f\U0001f600x", "f"):
        await store.set(scope, key, 1)
    assert await delete(store, scope, "é") == {"deleted": 2, "more": False}
    assert await delete(store, scope, "f\U0001f600") == {"deleted": 1, "more": False}
    assert await delete(store, scope, "f") == {"deleted": 2, "more": False}
    assert await store.list_keys(scope) == ["e", "ê", "êb"]


async def test_expired_entries_go_with_the_reapers_event(store: StateStore, scope: str) -> None:
    await store.set(scope, "x:live", 1, ttl_ms=HOUR_MS)
    await pass_time(await expiring(store, scope, ["x:dead"]))
    after = (await store.events(scope))[-1].revision
    result = await store.call("state::delete-by-prefix", {"scope": scope, "prefix": "x:"},
                              caller="w")
    assert result == {"deleted": 1, "more": False}
    events = await store.events(scope, after)
    assert sorted((e.key, e.type, e.by) for e in events) == [
        ("x:dead", "state:deleted", ""), ("x:live", "state:deleted", "w")]
    part = store.state.keys.for_scope(scope)
    assert await store.state.conn.execute("ZCARD", part.ttl) == 0


async def test_typed_method(store: StateStore, scope: str) -> None:
    await store.set(scope, "a1", 1)
    assert await store.delete_by_prefix(scope, "a", limit=5) == {"deleted": 1, "more": False}


async def refusal(store: StateStore, body: dict[str, Any]) -> tuple[str, Any]:
    with pytest.raises(StateError) as caught:
        await store.call("state::delete-by-prefix", body)
    return caught.value.code, caught.value.details


async def test_refusals(store: StateStore, scope: str) -> None:
    await store.set(scope, "a", 1)
    code, details = await refusal(store, {"scope": scope, "prefix": ""})
    assert (code, details["path"]) == ("INVALID_REQUEST", "$.prefix")
    for limit in (0, bulkread.MAX_DELETE_LIMIT + 1):
        code, details = await refusal(store, {"scope": scope, "prefix": "a", "limit": limit})
        assert (code, details["path"], details["limit"]) == \
            ("INVALID_REQUEST", "$.limit", bulkread.MAX_DELETE_LIMIT)
    code, details = await refusal(store, {"scope": scope, "prefix": "a" * 1025})
    assert (code, details["path"]) == ("INVALID_REQUEST", "$.prefix")
    code, details = await refusal(store, {"scope": scope})
    assert code == "INVALID_REQUEST"
    code, details = await refusal(store, {"scope": scope, "prefix": "a", "limt": 3})
    assert (code, details["path"], details["nearest"]) == ("UNKNOWN_FIELD", "$.limt", "limit")
    code, _ = await refusal(store, {"scope": "state_triggers", "prefix": "a"})
    assert code == "RESERVED_SCOPE"
    assert await store.list_keys(scope) == ["a"]
    assert bulkread.DEFAULT_DELETE_LIMIT == 1000
