"""Every state function in process (`StateStore.open(<seeds>)`) on one server and on the 3+3
Redis Cluster, with the same expected results: set / get / delete / update / compare-and-set /
list / list-entries / diff / topics / barrier / triggers / namespaces. On the cluster the
scopes' partitions are spread over the three primaries (checked), so each call is routed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from stateworker import StateError, StateStore
from tests.cluster import RedisCluster

pytestmark = pytest.mark.anyio

SCOPES = [f"s{n}" for n in range(8)]  # enough scopes for every one of the 4 partitions


def unique(scope: str) -> str:
    return f"{scope}-{uuid.uuid4().hex[:6]}"


async def code_of(store: StateStore, fn: str, body: dict[str, Any]) -> str:
    with pytest.raises(StateError) as caught:
        await store.call(fn, body)
    return caught.value.code


async def test_set_get_delete(store_on: StateStore) -> None:
    scopes = [unique(s) for s in SCOPES]
    for n, scope in enumerate(scopes):
        done = await store_on.call("state::set", {"scope": scope, "key": "k", "value": n})
        assert done["created"] is True and done["version"] == 1 and done["old_value"] is None
    assert [await store_on.call("state::get", {"scope": s, "key": "k"}) for s in scopes] == \
        list(range(len(scopes)))
    again = await store_on.call("state::set", {"scope": scopes[0], "key": "k", "value": "x"})
    assert again["old_value"] == 0 and again["version"] == 2 and again["created"] is False
    assert await code_of(store_on, "state::set", {"scope": scopes[0], "key": "k", "value": 1,
                                                  "expected_version": 1}) == "CONFLICT"
    await store_on.call("state::delete", {"scope": scopes[0], "key": "k"})
    assert await store_on.call("state::get", {"scope": scopes[0], "key": "k"}) is None
    entry = await store_on.call("state::get-entry", {"scope": scopes[1], "key": "k"})
    assert entry["found"] is True and entry["value"] == 1 and entry["version"] == 1


async def test_update_compare_and_set_diff(store_on: StateStore, scope: str) -> None:
    await store_on.call("state::set", {"scope": scope, "key": "c", "value": {"n": 1, "tags": []}})
    updated = await store_on.call("state::update", {"scope": scope, "key": "c", "ops": [
        {"type": "increment", "path": "n", "by": 2}, {"type": "set", "path": "m", "value": True}]})
    assert updated["new_value"] == {"n": 3, "tags": [], "m": True} and updated["version"] == 2
    swapped = await store_on.call("state::compare-and-set", {
        "scope": scope, "key": "c", "expected": {"n": 3, "tags": [], "m": True}, "value": 7})
    assert swapped == {"swapped": True}
    assert await store_on.call("state::get", {"scope": scope, "key": "c"}) == 7
    diff = await store_on.call("state::diff", {"scope": scope, "key": "d", "value": {"a": 1}})
    assert (diff["changed"], diff["found_previous"], diff["version"]) == (True, False, 1)
    again = await store_on.call("state::diff", {"scope": scope, "key": "d", "value": {"a": 2}})
    assert (again["previous"], again["previous_version"], again["version"]) == ({"a": 1}, 1, 2)


async def test_lists_and_entries(store_on: StateStore, scope: str) -> None:
    for key in ("b", "a", "c"):
        await store_on.call("state::set", {"scope": scope, "key": key, "value": key.upper(),
                                           "topic": "t1" if key != "c" else "t2"})
    assert await store_on.call("state::list", {"scope": scope}) == ["A", "B", "C"]
    assert await store_on.call("state::list_keys", {"scope": scope}) == {"keys": ["a", "b", "c"]}
    page = await store_on.call("state::list-entries", {"scope": scope, "topic_pattern": "t1",
                                                       "include_values": True})
    assert [e["key"] for e in page["entries"]] == ["a", "b"]
    assert [e["value"] for e in page["entries"]] == ["A", "B"]
    groups = await store_on.call("state::list_groups", {})
    assert groups == {"groups": [scope]}


async def test_topics(store_on: StateStore, scope: str) -> None:
    for key in ("x", "y", "z"):
        await store_on.call("state::set", {"scope": scope, "key": key, "value": 1,
                                           "topic": "keep" if key == "z" else "drop"})
    assert await store_on.call("state::update-topic", {"scope": scope, "key": "y",
                                                       "topic": "keep"}) == {"updated": True}
    assert await store_on.call("state::delete-by-topic", {"scope": scope,
                                                          "topic_pattern": "drop"}) == {"deleted": 1}
    assert await store_on.call("state::list_keys", {"scope": scope}) == {"keys": ["y", "z"]}
    assert [e.type for e in await store_on.events(scope)][:3] == ["state:created"] * 3


async def test_barrier(store_on: StateStore) -> None:
    # Barrier ids land in every partition: each one's arrivals stay on its own node.
    for n in range(6):
        bid = f"b-{uuid.uuid4().hex[:8]}-{n}"
        config = {"id": bid, "expect": 2}
        first = await store_on.call("state::barrier", {"event": {"key": "a"}, "condition_config": config})
        assert first["decision"] == "skip"
        last = await store_on.call("state::barrier", {"event": {"key": "b"}, "condition_config": config})
        assert last == {"decision": "allow", "reason": f"barrier `{bid}` complete (2/2)",
                        "payload": {"results": {"a": {"key": "a"}, "b": {"key": "b"}}}}


async def test_triggers_and_namespaces(store_on: StateStore, scope: str) -> None:
    await store_on.call("state::register-trigger", {
        "id": "t-1", "function_id": "reactor::on_change", "service": "reactor",
        "config": {"scope": scope}})
    listed = await store_on.call("state::list-triggers", {})
    assert [(t["id"], t["config"]) for t in listed["triggers"]] == [("t-1", {"scope": scope})]
    await store_on.call("state::unregister-trigger", {"id": "t-1"})
    assert (await store_on.call("state::list-triggers", {}))["triggers"] == []
    other = unique(scope)
    assert (await store_on.claim_namespace("billing", [other])).claimed
    await store_on.call("state::set", {"scope": scope, "key": "k", "value": 1})
    spaces = await store_on.call("state::list-namespaces", {})
    assert spaces == {"namespaces": [scope]}


async def test_the_cluster_spreads_the_partitions(redis_cluster: RedisCluster, prefix: str) -> None:
    """The partitions of a prefix land on more than one primary: the tests above route."""
    from stateworker.keys import KeySpace
    from stateworker.transport.slots import key_slot
    keys = KeySpace(prefix, 4)
    owners = {redis_cluster.owner(key_slot(keys.partition(n).tag)).port for n in range(4)}
    assert len(owners) >= 2
