"""state::list-entries (entries.lua) against real Redis: pages in every order, their fields,
prefixes and patterns, the paging it refuses, tampered cursors, long patterns, and expired
entries left out."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.clock import now_ms
from tests.lua.pages import fill, walk
from tests.lua.ttl import pass_time
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def ordered(entries: list[dict[str, Any]], order_by: str) -> bool:
    def sort_key(e: dict[str, Any]) -> tuple[Any, ...]:
        if order_by == "key":
            return (e["key"].encode(),)
        if order_by == "topic":
            return (e["topic"] is None, (e["topic"] or "").encode(), e["key"].encode())
        return (e["updated_at"], e["key"].encode())

    return [sort_key(e) for e in entries] == sorted(sort_key(e) for e in entries)


@pytest.mark.slow
async def test_ten_thousand_entries_paged_every_way(store: StateStore, scope: str) -> None:
    keys = await fill(store, scope, 10_000)
    for order_by, order in itertools.product(["key", "updated_at", "topic"], ["asc", "desc"]):
        entries = await walk(store, {"scope": scope, "order_by": order_by, "order": order,
                                     "limit": 1000 if order_by == "key" else 700})
        got = [e["key"] for e in entries]
        assert sorted(got) == keys, (order_by, order)  # every entry exactly once
        forward = entries if order == "asc" else entries[::-1]
        assert ordered(forward, order_by), (order_by, order)


async def test_page_fields_values_and_prefix(store: StateStore, scope: str) -> None:
    await store.set(scope, "a1", {"x": 1}, topic="t", ttl_ms=60_000)
    await store.set(scope, "a2", [1.50], by="exec-1")
    await store.set(scope, "b1", None)
    page = await store.call("state::list-entries", {"scope": scope, "prefix": "a",
                                                    "include_values": True})
    assert [e["key"] for e in page["entries"]] == ["a1", "a2"] and "next_after" not in page
    first, second = page["entries"]
    assert first["value"] == {"x": 1} and first["topic"] == "t" and first["expires_at"]
    assert second["updated_by"] == "exec-1" and second["version"] == 1
    entry = await store.call("state::get-entry", {"scope": scope, "key": "a1"})
    assert first["hash"] == entry["hash"] and first["created_at"] == entry["created_at"]
    bare = await store.call("state::list-entries", {"scope": scope, "limit": 2})
    assert "value" not in bare["entries"][0] and "next_after" in bare
    rest = await store.call("state::list-entries", {"scope": scope, "after": bare["next_after"]})
    assert [e["key"] for e in rest["entries"]] == ["b1"]
    offset = await store.call("state::list-entries", {"scope": scope, "offset": 1, "limit": 1,
                                                      "order": "desc"})
    assert [e["key"] for e in offset["entries"]] == ["a2"]
    raw_prefix = await store.call("state::list-entries", {"scope": scope, "prefix": "a",
                                                          "order": "desc"})
    assert [e["key"] for e in raw_prefix["entries"]] == ["a2", "a1"]


async def test_patterns_are_literal_except_star(store: StateStore, scope: str) -> None:
    for key in ["50%", "5x%", "a_b", "axb", "a?c", "abc", "A_B", "a*b"]:
        await store.set(scope, key, key, topic=key)
    await store.set(scope, "untagged", 0)

    async def keys(**filters: str) -> list[str]:
        page = await store.call("state::list-entries", {"scope": scope, **filters})
        return [e["key"] for e in page["entries"]]

    assert await keys(key_pattern="50%") == ["50%"]
    assert await keys(key_pattern="a_b") == ["a_b"]
    assert await keys(key_pattern="a?c") == ["a?c"]
    assert await keys(key_pattern="a*b") == ["a*b", "a_b", "axb"]
    assert await keys(key_pattern="*%") == ["50%", "5x%"]
    assert await keys(topic_pattern="a_*") == ["a_b"]
    assert await keys(topic_pattern="*") == sorted(
        ["50%", "5x%", "a_b", "axb", "a?c", "abc", "A_B", "a*b"], key=str.encode)
    assert "untagged" not in await keys(topic_pattern="*")
    assert await keys(key_pattern="*") == sorted(
        ["50%", "5x%", "a_b", "axb", "a?c", "abc", "A_B", "a*b", "untagged"], key=str.encode)


async def test_list_entries_rejects_bad_paging(store: StateStore, scope: str) -> None:
    for body, path in [({"limit": 0}, "$.limit"), ({"limit": 1001}, "$.limit"),
                       ({"offset": -1}, "$.offset"), ({"order_by": "size"}, "$.order_by"),
                       ({"after": "garbage"}, "$.after")]:
        with pytest.raises(StateError) as caught:
            await store.call("state::list-entries", {"scope": scope, **body})
        assert caught.value.code == "INVALID_REQUEST" and caught.value.details["path"] == path
    await store.set(scope, "a", 1)
    await store.set(scope, "b", 1)
    page = await store.call("state::list-entries", {"scope": scope, "limit": 1})
    with pytest.raises(StateError) as caught:
        await store.call("state::list-entries", {"scope": scope, "order": "desc",
                                                 "after": page["next_after"]})
    assert "order" in caught.value.message


async def test_paging_over_the_empty_key(store: StateStore, scope: str) -> None:
    for key in ["", "a", "b"]:
        await store.set(scope, key, key)
    for order_by, order in itertools.product(["key", "updated_at", "topic"], ["asc", "desc"]):
        with anyio.fail_after(10):
            entries = await walk(store, {"scope": scope, "order_by": order_by, "order": order,
                                         "limit": 1})
        assert sorted(e["key"] for e in entries) == ["", "a", "b"], (order_by, order)


async def test_tampered_cursor_is_an_invalid_request(store: StateStore, scope: str) -> None:
    await store.set(scope, "a", 1)
    await store.set(scope, "b", 1)
    for cursor in [["updated_at", "asc", "YQ==", "abc", 0], ["key", "asc", "YQ==", "", -1],
                   ["key", "asc", "not base64!", "", 0]]:
        text = base64.urlsafe_b64encode(msgspec.json.encode(cursor)).decode()
        with pytest.raises(StateError) as caught:
            await store.call("state::list-entries", {"scope": scope, "after": text,
                                                     "order_by": cursor[0]})
        assert caught.value.code == "INVALID_REQUEST" and caught.value.details["path"] == "$.after"


async def test_long_patterns_are_refused_and_star_runs_are_one_star(store: StateStore,
                                                                    scope: str) -> None:
    await store.set(scope, "ab", 1, topic="t")
    for field in ("prefix", "key_pattern", "topic_pattern"):
        with pytest.raises(StateError) as caught:
            await store.call("state::list-entries", {"scope": scope, field: "a" + "*" * 2000})
        assert caught.value.code == "INVALID_REQUEST"
        assert caught.value.details == {"path": f"$.{field}", "size": 2001, "limit": 1024}
    with pytest.raises(StateError) as caught:
        await store.call("state::list-namespaces", {"pattern": "*" * 1025})
    assert caught.value.details["path"] == "$.pattern"
    page = await store.call("state::list-entries", {"scope": scope, "key_pattern": "a" + "*" * 1000})
    assert [e["key"] for e in page["entries"]] == ["ab"]
    names = await store.call("state::list-namespaces", {"pattern": scope[:3] + "*" * 1000})
    assert scope in names["namespaces"]


async def test_list_entries_skips_expired_entries(redis_server: RedisServer, prefix: str,
                                                  scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        expired_by = 0
        for key, topic, ttl in [("a", None, 30), ("b", None, None), ("c", "t", 30),
                                ("d", "t", 3_600_000), ("e", None, None), ("f", "t", 30)]:
            await store.set(scope, key, key, topic=topic, ttl_ms=ttl)
            expired_by = now_ms() + 30
        await pass_time(expired_by)  # a, c and f have expired; the reaper is off

        async def keys(**body: Any) -> list[str]:
            got, after = [], None
            while True:
                page = await store.call("state::list-entries", {
                    "scope": scope, "include_values": True, **body,
                    **({"after": after} if after else {})})
                got += [e["key"] for e in page["entries"]]
                assert all(e["value"] == e["key"] for e in page["entries"])
                if (after := page.get("next_after")) is None:
                    return got

        for order_by in ("key", "updated_at", "topic"):
            for order in ("asc", "desc"):
                for limit in (1, 2, 1000):
                    got = await keys(order_by=order_by, order=order, limit=limit)
                    assert sorted(got) == ["b", "d", "e"], (order_by, order, limit, got)
        first = await store.call("state::list-entries", {"scope": scope, "limit": 2})
        assert [e["key"] for e in first["entries"]] == ["b", "d"]  # expired ones take no room
        assert await keys(topic_pattern="t") == ["d"]
        assert await keys(key_pattern="*", prefix="") == ["b", "d", "e"]
        assert await keys(offset=1) == ["d", "e"]
