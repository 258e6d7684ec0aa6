"""state::list and state::list_keys (list.lua) against real Redis: a scope's values or keys
in byte order."""

from __future__ import annotations

import pytest

from stateworker import StateStore

pytestmark = pytest.mark.anyio


async def test_list_and_list_keys_in_byte_order(store: StateStore, scope: str) -> None:
    assert await store.call("state::list", {"scope": scope}) == []
    assert await store.call("state::list_keys", {"scope": scope}) == {"keys": []}
    for key in ["b", "a", "é", "Z", "a:b", ""]:
        await store.call("state::set", {"scope": scope, "key": key, "value": key})
    expected = sorted(["b", "a", "é", "Z", "a:b", ""], key=str.encode)
    assert await store.call("state::list_keys", {"scope": scope}) == {"keys": expected}
    assert await store.call("state::list", {"scope": scope}) == expected
