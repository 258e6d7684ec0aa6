"""The cost of one call is bounded (STATEWORKER_MAX_CALL_BYTES, and 10,000 steps of update
work in an update or a transaction): a transaction, set-many or delete-many over it is
CALL_TOO_LARGE and writes nothing (no value, no event); a delete-by-prefix or delete-by-topic
batch stops at the budget and the next goes on, so they still delete everything asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from stateworker import StateError, StateStore
from stateworker.scripts.bindings import DELTOPIC, deltopic_call
from stateworker.state.kv.ops import MAX_CALL_STEPS
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

VALUE = {"s": "x" * 882}  # 890 bytes of JSON; a budget of 4000 holds four of them, not five


@pytest.fixture
async def small(redis_server: RedisServer, prefix: str) -> AsyncIterator[StateStore]:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=1000, max_call_bytes=4000) as store:
        yield store


async def events(store: StateStore, scope: str) -> int:
    return len(await store.events(scope))


async def refused(store: StateStore, fn: str, body: object) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call(fn, body)
    return caught.value


async def test_a_transaction_over_the_budget_writes_nothing(small: StateStore,
                                                            scope: str) -> None:
    for n in range(3):
        await small.set(scope, f"k{n}", VALUE)
    before = await events(small, scope)
    # Two updates: each reads 890 bytes and writes 896: 3572 in all, within 4000.
    bump = [{"type": "set", "path": "n", "value": 1}]
    done = await small.transaction(scope, [{"op": "update", "key": f"k{n}", "ops": bump}
                                           for n in range(2)])
    assert len(done["results"]) == 2
    # Three: the third's stored value passes it before it is read into anything.
    error = await refused(small, "state::transaction", {"scope": scope, "ops": [
        {"op": "update", "key": f"k{n}", "ops": bump} for n in range(3)]})
    assert error.code == "CALL_TOO_LARGE"
    assert error.details == {"op_index": 2, "size": 4 * 896 + 890, "limit": 4000}
    assert "4000 bytes" in error.message and "max_call_bytes" in error.message
    assert await events(small, scope) == before + 2  # (only the two-update transaction's)
    assert await small.get(scope, "k2") == VALUE


@pytest.mark.parametrize("fn", ["state::set-many", "state::delete-many"])
async def test_set_many_and_delete_many_over_the_budget_write_nothing(
        small: StateStore, scope: str, fn: str) -> None:
    for n in range(5):
        await small.set(scope, f"k{n}", VALUE)
    before = await events(small, scope)
    entries = [{"key": f"k{n}", **({"value": VALUE} if fn == "state::set-many" else {})}
               for n in range(5)]
    error = await refused(small, fn, {"scope": scope, "entries": entries})
    assert error.code == "CALL_TOO_LARGE" and error.details["limit"] == 4000
    assert await events(small, scope) == before
    assert sorted(await small.list_keys(scope)) == [f"k{n}" for n in range(5)]


async def test_a_transactions_updates_hold_at_most_the_ops_limit(small: StateStore,
                                                                 scope: str) -> None:
    bump = [{"type": "increment", "path": "n", "by": 1}] * 1000
    count = MAX_CALL_STEPS // 1000 + 1
    error = await refused(small, "state::transaction", {"scope": scope, "ops": [
        {"op": "update", "key": f"k{n}", "ops": bump} for n in range(count)]})
    assert error.code == "CALL_TOO_LARGE"
    assert error.details == {"path": f"$.ops[{count - 1}].ops", "size": count * 1000,
                             "limit": MAX_CALL_STEPS}
    assert await small.list_keys(scope) == []
    done = await small.transaction(scope, [{"op": "update", "key": f"k{n}", "ops": bump}
                                           for n in range(count - 1)])
    assert len(done["results"]) == count - 1


@pytest.fixture
async def roomy(redis_server: RedisServer, prefix: str) -> AsyncIterator[StateStore]:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store:
        yield store


async def test_an_update_of_many_merge_keys_is_refused_before_it_runs(roomy: StateStore,
                                                                     scope: str) -> None:
    """Each key of a merge value is a put in update.lua: 400 merges of 1,000 keys (4 MB, within
    the 1,000 ops of an update and the body's 5 MiB) held Redis 0.8 to 1.4 s in one script.
    The ops' steps (an op, each path level past the first, each merge key) are bounded."""
    await roomy.set(scope, "doc", {"n": 0})
    before = await events(roomy, scope)
    merge = {"type": "merge", "path": [], "value": {f"k{j:04d}": j for j in range(1000)}}
    error = await refused(roomy, "state::update", {"scope": scope, "key": "doc",
                                                   "ops": [merge] * 10})
    assert error.code == "CALL_TOO_LARGE"
    assert error.details == {"path": "$.ops", "size": 10 * 1001, "limit": MAX_CALL_STEPS}
    assert str(MAX_CALL_STEPS) in error.message and "$.ops" in error.message
    assert await events(roomy, scope) == before
    assert await roomy.get(scope, "doc") == {"n": 0}
    # (a merge's keys count up to the 1,024 an op may have: past them it is an op error)
    done = await roomy.update(scope, "doc", [merge] * 8 + [
        {"type": "merge", "path": [], "value": {f"x{j}": j for j in range(2000)}}])
    assert [e["code"] for e in done["errors"]] == ["merge.value.too_many_keys"]
    assert len(await roomy.get(scope, "doc")) == 1001


async def test_a_transaction_of_deep_paths_is_refused_before_it_runs(roomy: StateStore,
                                                                    scope: str) -> None:
    """Every op walks its path from the root: 10,000 merges on 16-level paths (within the
    ops limit) held Redis 0.15 to 0.26 s in one transaction. Each level counts."""
    deep = [{"type": "merge", "path": ["d"] * 16, "value": {"z": 1}}] * 100
    error = await refused(roomy, "state::transaction", {"scope": scope, "ops": [
        {"op": "update", "key": f"k{n}", "ops": deep} for n in range(100)]})
    assert error.code == "CALL_TOO_LARGE"
    assert error.details == {"path": "$.ops[5].ops", "size": 6 * 100 * 17,
                             "limit": MAX_CALL_STEPS}
    assert await roomy.list_keys(scope) == []
    done = await roomy.transaction(scope, [{"op": "update", "key": f"k{n}", "ops": deep}
                                           for n in range(5)])
    assert len(done["results"]) == 5


async def test_deletes_by_prefix_and_topic_go_on_past_the_budget_in_batches(
        small: StateStore, scope: str) -> None:
    for n in range(10):
        await small.set(scope, f"p{n}", VALUE)
        await small.set(scope, f"t{n}", VALUE, topic="old")
    first = await small.delete_by_prefix(scope, "p")
    assert (first["deleted"], first["more"]) == (5, True)  # four fit, the fifth passes it
    second = await small.delete_by_prefix(scope, "p")
    assert (second["deleted"], second["more"]) == (5, False)
    assert await small.delete_by_topic(scope, "old") == {"deleted": 10}
    assert await small.list_keys(scope) == []


async def test_one_delete_by_topic_batch_stops_at_the_budget(small: StateStore,
                                                             scope: str) -> None:
    """One script call of the delete-by-topic loop: four values fit, the fifth passes the
    budget and the batch ends there, its cursor at that entry (the loop goes on from it)."""
    for n in range(10):
        await small.set(scope, f"t{n}", VALUE, topic="old")
    state = small.state
    call = deltopic_call(state.settings, state.keys.for_scope(scope), scope, "", "old",
                         b"[old\0", b"[old\0\xff", 500)
    batch = await state.execute(state.script_plan(DELTOPIC, call, lambda reply: reply))
    assert batch == (5, b"old\0t4")
    assert len(await small.list_keys(scope)) == 5


async def test_a_delete_by_topic_batch_counts_the_expired_entries_it_drops(
        small: StateStore, scope: str) -> None:
    """An expired entry a batch meets is dropped with its event, its old value in it, as a
    live one is deleted: it counts in the budget too (uncounted, 500 expired entries of 1 MiB
    went into one script). Four fit, the fifth passes it; nothing is counted deleted."""
    for n in range(10):
        await small.set(scope, f"t{n}", VALUE, topic="old", ttl_ms=1)
    await anyio.sleep(0.01)  # (their 1 ms passes)
    state = small.state
    call = deltopic_call(state.settings, state.keys.for_scope(scope), scope, "", "old",
                         b"[old\0", b"[old\0\xff", 500)
    batch = await state.execute(state.script_plan(DELTOPIC, call, lambda reply: reply))
    assert batch == (0, b"old\0t4")
    assert len([e for e in await small.events(scope) if e.type == "state:deleted"]) == 5
