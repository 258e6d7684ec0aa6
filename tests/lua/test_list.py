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


async def test_a_listing_goes_on_past_a_chunk_ending_at_the_empty_key(
        store: StateStore, scope: str) -> None:
    """A chunk ends after the value that reaches its byte budget (reads.LIST_BYTES): ended at
    the key "" (the first in byte order), the listing goes on from there."""
    big = "x" * 1_048_570
    await store.call("state::set-many", {"scope": scope, "entries": [
        {"key": "", "value": big}, {"key": "a", "value": 1}, {"key": "b", "value": big},
        {"key": "c", "value": 3}]})
    assert await store.call("state::list_keys", {"scope": scope}) == {"keys": ["", "a", "b", "c"]}
    assert await store.call("state::list", {"scope": scope}) == [big, 1, big, 3]
