"""The reads that run no script, against real Redis: state::get, state::get-entry,
state::list_groups and state::list-namespaces."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from tests.calls import error_of, events

pytestmark = pytest.mark.anyio


async def test_get_missing_is_null_and_writes_no_event(store: StateStore, scope: str) -> None:
    assert await store.call("state::get", {"scope": scope, "key": "nope"}) is None
    assert await events(store, scope) == []


async def test_get_entry(store: StateStore, scope: str) -> None:
    assert await store.call("state::get-entry", {"scope": scope, "key": "k"}) == {"found": False}
    assert await store.call("state::get-entry", {"scope": scope, "key": "k", "default": []}) == {
        "found": False, "value": []}
    err = await error_of(store, "state::get-entry",
                         {"scope": scope, "key": "k", "default": 1, "required": True})
    assert err.code == "NOT_FOUND" and '"k"' in err.message
    await store.call("state::set", {"scope": scope, "key": "k", "value": 5, "topic": "tp"})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k", "default": 0})
    (event,) = await store.events(scope)
    assert entry["found"] is True and entry["value"] == 5 and entry["version"] == 1
    assert entry["topic"] == "tp" and entry["updated_by"] is None
    assert entry["revision"] == event.revision
    assert entry["created_at"] == entry["updated_at"]
    assert entry["created_at"].endswith("Z") and len(entry["created_at"]) == 24


async def test_list_groups(store: StateStore, scope: str) -> None:
    other = scope + "-other"
    await store.call("state::set", {"scope": other, "key": "k", "value": 1})
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1})
    assert await store.call("state::list_groups", {}) == {"groups": sorted([scope, other])}
    await store.call("state::delete", {"scope": other, "key": "k"})
    assert await store.call("state::list_groups", {}) == {"groups": [scope]}


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
