"""snaprows.lua against real Redis: a snapshot batch's entries read with every entry of the
transactions after the batch that wrote one of them (and over again, the transactions of
those), nothing of the transactions and single writes that touch none; the budget of events
examined."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateStore
from stateworker.keys import member
from stateworker.scripts.replies import SnapRowsReply
from stateworker.scripts.upkeep_bindings import SNAPROWS, snaprows_call
from stateworker.state.kv.packed import unpack
from stateworker.transport.plans import pipeline

pytestmark = pytest.mark.anyio


async def tx(store: StateStore, scope: str, **values: Any) -> None:
    await store.call("state::transaction", {"scope": scope, "ops": [
        {"op": "set", "key": key, "value": value} for key, value in values.items()]})


async def revision(store: StateStore, scope: str, key: str) -> str:
    found = (await store.get_entry(scope, key)).revision
    assert found is not None
    return found


async def rows(store: StateStore, scope: str, after: str, budget: int, keys: list[str]
               ) -> SnapRowsReply:
    state = store.state
    part = state.keys.for_scope(scope)
    (reply,) = await pipeline(state.conn, state.library, [SNAPROWS.command(
        state.library, *snaprows_call(part, after, budget, [member(scope, k) for k in keys]))])
    return SNAPROWS.read(reply)


async def test_the_transactions_after_the_batch_that_wrote_an_entry_read_come_whole(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "a", 1)
    after = await revision(store, scope, "a")
    await tx(store, scope, c=1, e=1)  # (linked to `a` only through c, by the next one)
    await tx(store, scope, d=1, f=1)  # touches nothing read
    await tx(store, scope, a=2, c=2)
    await store.set(scope, "g", 1)  # a single write: no transaction
    await store.delete(scope, "e")
    read = await rows(store, scope, after, 100, ["a", "b"])
    assert read.complete
    assert [None if s is None else unpack(s).value for s in read.stored] == [b"2", None]
    added = {(s, k): (rev, None if e is None else unpack(e).value)
             for s, k, rev, e in read.added}
    assert set(added) == {(scope, "c"), (scope, "e")}
    assert added[(scope, "c")] == ((await revision(store, scope, "c")).encode(),
                                   b"2")
    assert added[(scope, "e")][1] is None  # deleted since: its last change's revision comes
    assert added[(scope, "e")][0] > added[(scope, "c")][0]


async def test_a_tail_longer_than_the_budget_is_not_complete(store: StateStore,
                                                             scope: str) -> None:
    await store.set(scope, "a", 1)
    after = await revision(store, scope, "a")
    for n in range(300):
        await store.set(scope, f"k{n}", n)
    assert not (await rows(store, scope, after, 10, ["a"])).complete
    assert (await rows(store, scope, after, 1000, ["a"])).complete


async def test_a_tail_of_large_values_stops_at_the_byte_budget(store: StateStore,
                                                               scope: str) -> None:
    """Events carry whole values: 40 events of 200 KB each (old and new: ~16 MB) are not all
    moved into one script call under a 1 MiB budget; 16 events at a time, it stops at the
    first read that passes it."""
    await store.set(scope, "a", 1)
    after = await revision(store, scope, "a")
    for n in range(40):
        await store.set(scope, "big", "x" * 200_000 + str(n))
    state = store.state
    part = state.keys.for_scope(scope)
    (reply,) = await pipeline(state.conn, state.library, [SNAPROWS.command(
        state.library, *snaprows_call(part, after, 1000, [member(scope, "a")], 1 << 20))])
    assert not SNAPROWS.read(reply).complete
    (reply,) = await pipeline(state.conn, state.library, [SNAPROWS.command(
        state.library, *snaprows_call(part, after, 1000, [member(scope, "a")], 64 << 20))])
    assert SNAPROWS.read(reply).complete
