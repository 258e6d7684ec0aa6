"""aside.lua against real Redis: a set-aside trigger's mark set, moved and dropped only by
the holder of the partition's lease; arguments that are not a mark refused before any write."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.errors import InternalError
from stateworker.scripts.upkeep_bindings import ASIDE, aside_call
from stateworker.transport.plans import pipeline

pytestmark = pytest.mark.anyio


async def run(store: StateStore, token: str, trigger_id: str, mark: tuple[str, int] | None
              ) -> bool:
    state = store.state
    part = state.keys.partition(0)
    (reply,) = await pipeline(state.conn, state.library, [ASIDE.command(
        state.library, *aside_call(part, token, trigger_id, mark))])
    return ASIDE.read(reply).done


async def test_only_the_lease_holder_sets_moves_and_drops_a_mark(store: StateStore) -> None:
    conn, part = store.state.conn, store.state.keys.partition(0)
    assert not await run(store, "mine", "t", ("5-0", 3))  # (no lease at all)
    await conn.execute("SET", part.lease, "mine", "PX", 10_000)
    assert await run(store, "mine", "t", ("5-0", 3))
    assert await conn.execute("HGETALL", part.aside) == [b"t", b"5-0 3"]
    assert not await run(store, "other", "t", ("9-0", 7))  # a lapsed holder's move
    assert not await run(store, "other", "t", None)  # ... and its drop
    assert await conn.execute("HGETALL", part.aside) == [b"t", b"5-0 3"]
    assert await run(store, "mine", "t", ("9-0", 7))
    assert await conn.execute("HGET", part.aside, "t") == b"9-0 7"
    assert await run(store, "mine", "t", None)
    assert await conn.execute("EXISTS", part.aside) == 0


async def test_arguments_that_are_not_a_mark_are_refused_before_a_write(
        store: StateStore) -> None:
    state = store.state
    part = state.keys.partition(0)
    await state.conn.execute("SET", part.lease, "mine", "PX", 10_000)
    for args in (["mine", "move", "t", "1-0", "1"], ["mine", "set", "t", "1-0", "x"],
                 ["mine", "set", "", "1-0", "1"], ["mine", "set", "t", "", "1"]):
        (reply,) = await pipeline(state.conn, state.library, [ASIDE.command(
            state.library, [part.lease, part.aside], args)])
        with pytest.raises(InternalError):
            ASIDE.read(reply)
    assert await state.conn.execute("EXISTS", part.aside) == 0
