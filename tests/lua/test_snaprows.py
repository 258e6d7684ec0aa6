"""snaprows.lua against real Redis: a snapshot batch, the events after the position bounded in
count and in bytes (one event at least, however large; never ending inside a transaction), the
entries it changed, with every entry of the transactions after the batch that wrote one of
them (and over again, the transactions of those), nothing of the transactions and single
writes that touch none; the budgets of events examined after it."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateStore
from stateworker.scripts.replies import SnapRowsReply
from stateworker.scripts.upkeep_bindings import SNAPROWS, snaprows_call
from stateworker.state.kv.packed import unpack
from stateworker.transport.plans import pipeline

pytestmark = pytest.mark.anyio

MIB = 1 << 20


async def tx(store: StateStore, scope: str, **values: Any) -> None:
    await store.call("state::transaction", {"scope": scope, "ops": [
        {"op": "set", "key": key, "value": value} for key, value in values.items()]})


async def revision(store: StateStore, scope: str, key: str) -> str:
    found = (await store.get_entry(scope, key)).revision
    assert found is not None
    return found


async def batch(store: StateStore, scope: str, position: str, most: int = 1000,
                max_bytes: int = 64 * MIB, tail: int = 1000, tail_bytes: int = MIB
                ) -> SnapRowsReply:
    state = store.state
    part = state.keys.for_scope(scope)
    (reply,) = await pipeline(state.conn, state.library, [SNAPROWS.command(
        state.library, *snaprows_call(part, position, most, max_bytes, tail, tail_bytes))])
    return SNAPROWS.read(reply)


def values(read: SnapRowsReply) -> dict[str, bytes | None]:
    return {key: None if entry is None else unpack(entry).value
            for _, key, _, entry in read.rows}


async def test_the_transactions_after_the_batch_that_wrote_an_entry_read_come_whole(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "b", 1)
    position = await revision(store, scope, "b")
    await store.set(scope, "a", 1)  # the batch (most = 1)
    await tx(store, scope, c=1, e=1)  # (linked to `a` only through c, by the next one)
    await tx(store, scope, d=1, f=1)  # touches nothing read
    await tx(store, scope, a=2, c=2)
    await store.set(scope, "g", 1)  # a single write: no transaction
    await store.delete(scope, "e")
    read = await batch(store, scope, position, most=1)
    assert (read.events, read.more, read.complete) == (1, True, True)
    assert [key for _, key, _, _ in read.rows] == ["a", "c", "e"]
    assert values(read) == {"a": b"2", "c": b"2", "e": None}
    revisions = {key: rev for _, key, rev, _ in read.rows}
    assert revisions["c"] == (await revision(store, scope, "c")).encode()
    assert revisions["e"] > revisions["c"]  # deleted since: its last change's revision comes


async def test_a_batch_stops_at_its_byte_budget_one_event_at_least_and_the_next_goes_on(
        store: StateStore, scope: str) -> None:
    """Events of ~300 KB values under a 500 KB budget: each event and its entry pass it, so
    each batch holds one event (not none, however large), and batch after batch from where
    the last stopped reads every event once, in order."""
    await store.set(scope, "start", 1)
    position = await revision(store, scope, "start")
    written = []
    for n in range(6):
        await store.set(scope, f"big{n}", "x" * 300_000 + str(n))
        written.append(await revision(store, scope, f"big{n}"))
    seen = []
    for _ in range(len(written) + 1):
        read = await batch(store, scope, position, max_bytes=500_000)
        if read.last is None:
            break
        assert read.events == 1 and len(read.rows) == 1
        assert read.more == (read.last != written[-1])
        seen.append(read.last)
        position = read.last
    assert seen == written
    # With room for them all, one batch.
    start = await revision(store, scope, "start")
    read = await batch(store, scope, start, max_bytes=64 * MIB)
    assert (read.events, read.last, read.more) == (6, written[-1], False)
    # A count bound stops it too.
    read = await batch(store, scope, start, most=4)
    assert (read.events, read.last, read.more) == (4, written[3], True)


async def test_a_batch_never_ends_inside_a_transaction(store: StateStore, scope: str) -> None:
    await store.set(scope, "start", 1)
    position = await revision(store, scope, "start")
    await tx(store, scope, **{f"k{n}": "y" * 100_000 for n in range(5)})
    await store.set(scope, "after", 1)
    for most, max_bytes in ((1, 64 * MIB), (1000, 1), (2, 250_000)):
        read = await batch(store, scope, position, most=most, max_bytes=max_bytes)
        assert (read.events, read.more) == (5, True), (most, max_bytes)
        assert read.last == await revision(store, scope, "k4")
        assert sorted(values(read)) == [f"k{n}" for n in range(5)]


async def test_a_tail_longer_than_the_budget_is_not_complete(store: StateStore,
                                                             scope: str) -> None:
    await store.set(scope, "b", 1)
    position = await revision(store, scope, "b")
    await store.set(scope, "a", 1)
    for n in range(300):
        await store.set(scope, f"k{n}", n)
    assert not (await batch(store, scope, position, most=1, tail=10)).complete
    assert (await batch(store, scope, position, most=1, tail=1000)).complete


async def test_a_tail_of_large_values_stops_at_the_byte_budget(store: StateStore,
                                                               scope: str) -> None:
    """Events carry whole values: 40 events of 200 KB each (old and new: ~16 MB) are not all
    moved into one script call under a 1 MiB budget: read a few at a time (as many of the
    size seen as make 1 MiB), it stops at the first read that passes it."""
    await store.set(scope, "b", 1)
    position = await revision(store, scope, "b")
    await store.set(scope, "a", 1)
    for n in range(40):
        await store.set(scope, "big", "x" * 200_000 + str(n))
    assert not (await batch(store, scope, position, most=1, tail_bytes=MIB)).complete
    assert (await batch(store, scope, position, most=1, tail_bytes=64 * MIB)).complete


async def test_the_entries_transactions_after_add_have_a_byte_budget(store: StateStore,
                                                                     scope: str) -> None:
    """The entries a transaction after the batch adds count against a budget of their own
    (the batch's): past it the rest is left, and the read says it is not complete."""
    await store.set(scope, "b", 1)
    position = await revision(store, scope, "b")
    await store.set(scope, "a", 1)
    await tx(store, scope, a=2, c=1)
    await tx(store, scope, c="z" * 200_000, d=1)  # (c, read for the first, is large now)
    read = await batch(store, scope, position, most=1, max_bytes=150_000)
    assert not read.complete and sorted(values(read)) == ["a", "c"]
    read = await batch(store, scope, position, most=1, max_bytes=MIB)
    assert read.complete and sorted(values(read)) == ["a", "c", "d"]
