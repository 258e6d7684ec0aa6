"""state::update-topic (topic.lua) against real Redis: the entry retagged, its value, version
and update time kept."""

from __future__ import annotations

import pytest

from stateworker import StateStore

pytestmark = pytest.mark.anyio


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
