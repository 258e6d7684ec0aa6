"""`state::transaction` follows etcd's rule for a key named twice in one list: two deletes of a
key are allowed and applied once (one event, each delete answered with the one outcome, the
scope's count down by one); two writes of a key, or a write and a delete, are refused before
anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateError, StateStore

pytestmark = pytest.mark.anyio


async def refused(store: StateStore, body: dict[str, Any]) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call("state::transaction", body)
    return caught.value


async def test_a_key_deleted_twice_is_deleted_once(store: StateStore, scope: str) -> None:
    for key in ("a", "b", "c"):
        await store.set(scope, key, 1)
    before = len(await store.events(scope))
    done = await store.call("state::transaction", {"scope": scope, "ops": [
        {"op": "delete", "key": "a"}, {"op": "set", "key": "b", "value": 2},
        {"op": "delete", "key": "a"}]})
    assert [r["op"] for r in done["results"]] == ["delete", "set", "delete"]
    assert done["results"][0] == done["results"][2] and done["results"][0]["deleted"] is True
    events = (await store.events(scope))[before:]
    assert [(e.key, e.type) for e in events] == [("a", "state:deleted"), ("b", "state:updated")]
    assert await store.list_keys(scope) == ["b", "c"]  # (a's count taken once)
    # a condition on either delete holds for the one delete
    stale = await refused(store, {"scope": scope, "ops": [
        {"op": "delete", "key": "c"}, {"op": "delete", "key": "c", "expected_version": 7}]})
    assert stale.code == "CONFLICT" and stale.details["path"] == "$.ops[0]"
    assert await store.get(scope, "c") == 1
    await store.call("state::transaction", {"scope": scope, "ops": [
        {"op": "delete", "key": "c", "expected_version": 1},
        {"op": "delete", "key": "c", "expected_version": 1}]})
    assert await store.list_keys(scope) == ["b"]


async def test_a_key_written_twice_is_refused(store: StateStore, scope: str) -> None:
    await store.set(scope, "k", 1)
    for ops in ([{"op": "set", "key": "k", "value": 2}, {"op": "set", "key": "k", "value": 3}],
                [{"op": "set", "key": "k", "value": 2}, {"op": "delete", "key": "k"}],
                [{"op": "delete", "key": "k"}, {"op": "set", "key": "k", "value": 2}],
                [{"op": "delete", "key": "k", "expected_version": 1},
                 {"op": "delete", "key": "k", "expected_version": 2}]):
        error = await refused(store, {"scope": scope, "ops": ops})
        assert error.code == "DUPLICATE_KEY", ops
        assert (error.details["first_index"], error.details["op_index"]) == (0, 1)
    assert await store.get(scope, "k") == 1
