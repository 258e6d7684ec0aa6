"""Which bus call records a snapshot commit carries (snapshot/calls.py `read_unsaved`): the
record of a call whose first change the commit holds, and no other. A record committed before
its change would answer the retry of a call whose change a restore lost, without applying it;
a change committed without its record would be applied twice by a retry after a restore."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateStore
from stateworker.context import CallContext
from stateworker.events.model import revision_of
from stateworker.keys import call_field, member
from stateworker.snapshot import calls
from stateworker.state import functions, generation

pytestmark = pytest.mark.anyio


async def bus_set(store: StateStore, call_id: str, key: str, value: Any) -> tuple[int, int]:
    """A `state::set` made as the service makes a bus call's (its record kept, and, with the
    snapshot on, in the partition's unsaved records); the revision of its change."""
    body = msgspec.json.encode({"scope": "s", "key": key, "value": value})
    ctx = CallContext(call_id=call_id, call_digest="0" * 40)
    result = await store.state.execute(functions.prepare(store.state, "state::set", body, ctx))
    assert result.version >= 1
    events = await store.state.conn.execute(
        "XREVRANGE", store.state.keys.for_scope("s").events, "+", "-", "COUNT", 1)
    return revision_of(events[0][0])


async def test_a_commit_carries_the_records_of_the_changes_it_holds_and_no_other(
        store: StateStore) -> None:
    store.state.settings = msgspec.structs.replace(store.state.settings,
                                                   postgres_url="postgresql://unused")
    first = await bus_set(store, "c1", "a", 1)
    await bus_set(store, "c2", "b", 1)
    third = await bus_set(store, "c3", "a", 2)
    partition = store.state.keys.partition_of("s")
    markers = await generation.read(store.state.conn, store.state.keys)
    assert markers.meta is not None
    # A batch up to c1's change, whose read of `a` already holds c3's: c1 and c3 go with it,
    # c2 (its change on `b`, not read) waits.
    unsaved = calls.read_unsaved(store.state, partition, first, markers.meta,
                                 {member("s", "a"): third})
    assert [row.field async for page in unsaved.pages() for row in page] == [
        call_field("c1"), call_field("c3")]
    assert len(unsaved.done) == 2
    await calls.forget_saved(store.state, partition, unsaved)
    # The next batch, past c2's change, takes it.
    later = calls.read_unsaved(store.state, partition, third, markers.meta, {})
    assert [row.field async for page in later.pages() for row in page] == [call_field("c2")]
