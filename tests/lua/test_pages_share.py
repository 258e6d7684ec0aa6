"""state::list_entries' snapshots are a shared room of a partition: one caller opening listings
in a loop (first pages, never finished) must not crowd out another caller's listings, in the
partition it floods, over any door. Each caller has a share of the room (pages.PER_CALLER): a
caller over it loses its own oldest snapshot, never another's."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateError, StateStore
from stateworker.state.kv import pages

pytestmark = pytest.mark.anyio
FN = "state::list_entries"


async def page(store: StateStore, body: dict[str, Any], caller: str) -> dict[str, Any]:
    result: dict[str, Any] = await store.call(FN, body, caller=caller)
    return result


async def code_of(store: StateStore, body: dict[str, Any], caller: str) -> str:
    with pytest.raises(StateError) as refused:
        await store.call(FN, body, caller=caller)
    return refused.value.code


def neighbour(store: StateStore, scope: str, name: str) -> str:
    """A scope of `name`'s making in the partition of `scope`."""
    tag = store.state.keys.for_scope(scope).tag
    return next(f"{name}-{i}" for i in range(10_000)
                if store.state.keys.for_scope(f"{name}-{i}").tag == tag)


async def two_entries(store: StateStore, scope: str) -> None:
    for key in ("a", "b"):
        await store.set(scope, key, key)


async def test_a_flooding_caller_leaves_other_callers_listings_alone(
        store: StateStore, scope: str) -> None:
    victim_scope, flood_scope = scope, neighbour(store, scope, "flood")
    await two_entries(store, victim_scope)
    await two_entries(store, flood_scope)
    body = {"scope": victim_scope, "limit": 1}
    held = (await page(store, body, "victim"))["next_cursor"]  # a listing under way
    flood = {"scope": flood_scope, "limit": 1}
    refused, tokens = 0, []
    for _ in range(5 * pages.MAX_SNAPSHOTS):  # first pages, never finished
        try:
            tokens.append((await page(store, flood, "flooder"))["next_cursor"])
        except StateError as exc:
            assert exc.code == "SNAPSHOT_CAPACITY", exc
            refused += 1
    # The victim goes on with its listing and starts new ones, in the flooded partition.
    assert (await page(store, {**body, "cursor": held}, "victim"))["done"]
    started = [(await page(store, body, "victim"))["next_cursor"]
               for _ in range(pages.PER_CALLER)]
    for token in started:
        assert (await page(store, {**body, "cursor": token}, "victim"))["entries"] == [
            ["b", "b"]]
    # The flooder was never refused: it lost its own oldest listings, kept its newest share.
    assert refused == 0 and len(tokens) == 5 * pages.MAX_SNAPSHOTS
    for token in tokens[:-pages.PER_CALLER]:
        assert await code_of(store, {**flood, "cursor": token}, "flooder") == "INVALID_CURSOR"
    with pytest.raises(StateError) as dropped:
        await page(store, {**flood, "cursor": tokens[0]}, "flooder")
    assert f"at most {pages.PER_CALLER} live listings in a partition" in dropped.value.message
    for token in tokens[-pages.PER_CALLER:]:
        assert (await page(store, {**flood, "cursor": token}, "flooder"))["done"]


async def test_a_callers_next_page_keeps_its_place_in_its_share(
        store: StateStore, scope: str) -> None:
    """A page read renames the snapshot: it stays the caller's, counted once, and its age is
    its capture's (the oldest is the one captured first, however far it was read)."""
    for key in ("a", "b", "c"):
        await store.set(scope, key, key)
    body = {"scope": scope, "limit": 1}
    first = (await page(store, body, "w"))["next_cursor"]
    second = (await page(store, {**body, "cursor": first}, "w"))["next_cursor"]
    others = [(await page(store, body, "w"))["next_cursor"] for _ in range(pages.PER_CALLER - 1)]
    newest = (await page(store, body, "w"))["next_cursor"]  # past the share: the oldest goes
    assert await code_of(store, {**body, "cursor": second}, "w") == "INVALID_CURSOR"
    for token in [*others, newest]:
        assert (await page(store, {**body, "cursor": token}, "w"))["offset"] == 1


async def test_a_full_partition_refuses_a_caller_with_nothing_to_give_back(
        store: StateStore, scope: str) -> None:
    """The partition's room stays bounded (pages.MAX_SNAPSHOTS): callers each within their
    share may fill it; then a caller holding none is refused, naming the bound, and one that
    holds some gives back its own oldest."""
    await two_entries(store, scope)
    body = {"scope": scope, "limit": 1}
    callers = [f"w{i}" for i in range(pages.MAX_SNAPSHOTS // pages.PER_CALLER)]
    held = {who: [(await page(store, body, who))["next_cursor"]
                  for _ in range(pages.PER_CALLER)] for who in callers}
    with pytest.raises(StateError) as refused:
        await page(store, body, "late")
    assert refused.value.code == "SNAPSHOT_CAPACITY"
    assert refused.value.details["bound"] == "snapshots"
    assert refused.value.details["limit"] == pages.MAX_SNAPSHOTS
    assert "pages.MAX_SNAPSHOTS" in refused.value.message
    again = (await page(store, body, "w0"))["next_cursor"]
    assert await code_of(store, {**body, "cursor": held["w0"][0]}, "w0") == "INVALID_CURSOR"
    for token in [*held["w0"][1:], again]:
        assert (await page(store, {**body, "cursor": token}, "w0"))["done"]
    for who in callers[1:]:
        assert (await page(store, {**body, "cursor": held[who][0]}, who))["done"]
