"""state::delete (delete.lua) against real Redis: the value it returns and the event written."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from tests.calls import events

pytestmark = pytest.mark.anyio


async def test_delete(store: StateStore, scope: str) -> None:
    assert await store.call("state::delete", {"scope": scope, "key": "k"}) is None
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v"})
    assert await store.call("state::delete", {"scope": scope, "key": "k"}) == "v"
    assert await store.call("state::get", {"scope": scope, "key": "k"}) is None
    assert await store.call("state::delete", {"scope": scope, "key": "k"}) is None
    assert await events(store, scope) == [
        ("state:created", "k", None, "v", 1),
        ("state:deleted", "k", "v", None, 1),
    ]
    again = await store.call("state::set", {"scope": scope, "key": "k", "value": "w"})
    assert again["version"] == 1 and again["created"] is True
