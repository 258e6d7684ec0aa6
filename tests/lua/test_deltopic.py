"""state::delete-by-topic (deltopic.lua) against real Redis: batch after batch, untagged
entries never match."""

from __future__ import annotations

import pytest

from stateworker import StateError, StateStore
from tests.lua.pages import fill, walk

pytestmark = pytest.mark.anyio


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
    assert caught.value.details["path"] == "$.topic_pattern"
