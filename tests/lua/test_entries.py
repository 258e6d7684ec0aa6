"""list-entries pages, patterns, delete-by-topic, update-topic, diff and list-namespaces."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateError, StateStore

pytestmark = pytest.mark.anyio


async def fill(store: StateStore, scope: str, count: int) -> list[str]:
    """`count` entries; topics t0..t4 on most, none on every 7th; writes run concurrently."""
    keys = [f"k{i:05d}" for i in range(count)]

    async def writer(chunk: list[str]) -> None:
        for key in chunk:
            i = int(key[1:])
            topic = None if i % 7 == 0 else f"t{i % 5}"
            await store.set(scope, key, i, topic=topic)

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(writer, keys[n::50])
    return keys


async def walk(store: StateStore, body: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    after = None
    while True:
        page = await store.call("state::list-entries", {**body, **({"after": after} if after else {})})
        entries += page["entries"]
        after = page.get("next_after")
        if after is None:
            return entries


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


async def test_delete_by_topic(store: StateStore, scope: str) -> None:
    keys = await fill(store, scope, 1200)
    tagged_t1 = [k for k in keys if int(k[1:]) % 7 and int(k[1:]) % 5 == 1]
    result = await store.call("state::delete-by-topic", {"scope": scope, "topic_pattern": "t1"})
    assert result == {"deleted": len(tagged_t1)}
    remaining = await walk(store, {"scope": scope, "limit": 1000})
    assert len(remaining) == 1200 - len(tagged_t1)
    all_tagged = await store.call("state::delete-by-topic", {"scope": scope, "topic_pattern": "*"})
    untagged = [k for k in keys if int(k[1:]) % 7 == 0]
    assert all_tagged == {"deleted": 1200 - len(tagged_t1) - len(untagged)}
    assert await store.list_keys(scope) == untagged
    deleted = [e for e in await store.events(scope) if e.type == "state:deleted"]
    assert len(deleted) == 1200 - len(untagged)
    with pytest.raises(StateError) as caught:
        await store.call("state::delete-by-topic", {"scope": scope})
    assert caught.value.code == "INVALID_REQUEST"
    assert caught.value.details["path"] == "$"


async def test_update_topic(store: StateStore, scope: str) -> None:
    assert await store.call("state::update-topic", {"scope": scope, "key": "nope",
                                                    "topic": "x"}) == {"updated": False}
    await store.set(scope, "k", {"v": 1}, topic="old")
    before = await store.get_entry(scope, "k")
    assert await store.call("state::update-topic", {"scope": scope, "key": "k",
                                                    "topic": "new"}) == {"updated": True}
    after = await store.get_entry(scope, "k")
    assert (after.topic, after.version, after.updated_at, after.value) == (
        "new", before.version, before.updated_at, {"v": 1})
    event = (await store.events(scope))[-1]
    assert (event.type, bytes(event.old_value), bytes(event.new_value), event.version) == (
        "state:updated", b'{"v":1}', b'{"v":1}', 1)
    page = await store.call("state::list-entries", {"scope": scope, "topic_pattern": "new"})
    assert [e["key"] for e in page["entries"]] == ["k"]
    await store.call("state::update-topic", {"scope": scope, "key": "k", "topic": None})
    assert (await store.get_entry(scope, "k")).topic is None
    page = await store.call("state::list-entries", {"scope": scope, "topic_pattern": "*"})
    assert page["entries"] == []


async def test_diff(store: StateStore, scope: str) -> None:
    first = await store.call("state::diff", {"scope": scope, "key": "k", "value": {"a": 1, "b": 2}})
    assert first["changed"] is True and first["found_previous"] is False and first["version"] == 1
    same = await store.call("state::diff", {"scope": scope, "key": "k", "value": {"b": 2, "a": 1}})
    assert same["changed"] is False and same["previous_version"] == 1
    assert same["previous"] == {"a": 1, "b": 2}
    changed = await store.call("state::diff", {"scope": scope, "key": "k", "value": {"a": 2}})
    assert changed == {"changed": True, "found_previous": True, "previous_version": 1,
                       "previous": {"a": 1, "b": 2}, "version": 2, "hash": changed["hash"]}
    dry = await store.call("state::diff", {"scope": scope, "key": "k", "value": 3,
                                           "update": False})
    assert dry["changed"] is True and "version" not in dry
    assert await store.get(scope, "k") == {"a": 2}
    with pytest.raises(StateError) as caught:
        await store.call("state::diff", {"scope": scope, "key": "k", "value": 4,
                                         "expected_version": 1})
    assert caught.value.code == "CONFLICT"
    assert len(await store.events(scope)) == 2


async def test_list_namespaces(store: StateStore, scope: str) -> None:
    for name in ["ns-a", "ns-b", "other"]:
        await store.set(f"{scope}{name}", "k", 1)
    result = await store.call("state::list-namespaces", {"pattern": f"{scope}ns-*"})
    assert result == {"namespaces": [f"{scope}ns-a", f"{scope}ns-b"]}
    groups = await store.call("state::list_groups", {})
    everything = await store.call("state::list-namespaces", {})
    assert everything["namespaces"] == groups["groups"]
    limited = await store.call("state::list-namespaces", {"limit": 1})
    assert len(limited["namespaces"]) == 1


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
