"""`state::transaction` on one server and on the 3+3 Redis Cluster, with the same expected
results: all or nothing (a failed precondition leaves values, versions, indexes and events as
they were), every op kind's result, the `compare` branch, DUPLICATE_KEY, an update op's error as
the transaction's, the key limit, events that carry the transaction's id and size, and a watch
that never stops inside a transaction."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.codec import hash_tree
from stateworker.context import CallContext
from stateworker.events.watch import Watch
from stateworker.settings import Settings
from stateworker.state import functions

pytestmark = pytest.mark.anyio


def fresh(scope: str) -> str:
    return f"{scope}-{uuid.uuid4().hex[:6]}"


async def failure(store: StateStore, body: dict[str, Any]) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call("state::transaction", body)
    return caught.value


async def snapshot(store: StateStore, scope: str) -> tuple[Any, ...]:
    """Everything a failed transaction must leave as it was: every entry with its version,
    hash, topic and expiry, the scope's indexes (by key, by update time, by topic) and its
    events."""
    by_key = await store.call("state::list-entries", {"scope": scope, "include_values": True})
    by_time = await store.call("state::list-entries", {"scope": scope, "order_by": "updated_at"})
    by_topic = await store.call("state::list-entries", {"scope": scope, "order_by": "topic"})
    events = await store.events(scope)
    return by_key, by_time, by_topic, [e.revision for e in events]


async def test_a_failed_precondition_writes_nothing(store_on: StateStore) -> None:
    scope = fresh("tx")
    await store_on.set(scope, "a", {"n": 1}, topic="t1")
    await store_on.set(scope, "b", [1], ttl_ms=600_000)
    await store_on.set(scope, "p", "p", topic="t0")
    await store_on.set(scope, "q", "q")
    before = await snapshot(store_on, scope)
    for third in ({"op": "check", "key": "a", "expected_version": 2},
                  {"op": "check", "key": "b", "absent": True},
                  {"op": "check", "key": "zz", "exists": True},
                  {"op": "set", "key": "c", "value": 1, "create_only": True},
                  {"op": "delete", "key": "a", "expected_version": 5},
                  {"op": "compare-and-set", "key": "b", "expected": [2], "value": 0},
                  {"op": "update", "key": "a", "expected_version": 3, "ops": []},
                  {"op": "update", "key": "b", "ops": [
                      {"type": "increment", "path": "n", "by": 1}]}):
        if third["op"] == "set":
            await store_on.set(scope, "c", 0)
            before = await snapshot(store_on, scope)
        error = await failure(store_on, {"scope": scope, "ops": [
            {"op": "set", "key": "p", "value": {"n": 2}, "topic": "t2"},
            {"op": "delete", "key": "q"}, third,
            {"op": "update", "key": "d", "ops": [{"type": "set", "path": "x", "value": 1}]}]})
        assert error.details["op_index"] == 2, error
        assert error.details["path"].startswith("$.ops[2]"), error
        assert error.code == ("increment.target_not_object" if third["op"] == "update" and
                              third["key"] == "b" else "CONFLICT"), error
        assert "wrote nothing" in error.message
        assert await snapshot(store_on, scope) == before, third


async def test_every_op_kind_applies_and_reports(store_on: StateStore) -> None:
    scope = fresh("tx")
    await store_on.set(scope, "a", {"n": 1})
    await store_on.set(scope, "gone", "x")
    done = await store_on.transaction(scope, [
        {"op": "check", "key": "a", "expected_version": 1, "exists": True},
        {"op": "set", "key": "b", "value": [1, {}], "topic": "blue", "ttl_ms": 600_000},
        {"op": "update", "key": "a", "ops": [{"type": "increment", "path": "n", "by": 9007199254740993}]},
        {"op": "compare-and-set", "key": "c", "value": "new"},
        {"op": "delete", "key": "gone", "expected_version": 1},
        {"op": "delete", "key": "never"}])
    results = {r["key"] + ":" + r["op"]: r for r in done["results"]}
    assert done["branch"] == "ops" and len(done["results"]) == 6
    assert results["a:check"] == {"op": "check", "key": "a", "version": 1}
    assert results["b:set"]["created"] is True and results["b:set"]["new_value"] == [1, {}]
    assert results["a:update"]["new_value"] == {"n": 9007199254740994}
    assert results["a:update"]["version"] == 2 and results["a:update"]["old_value"] == {"n": 1}
    assert results["c:compare-and-set"]["version"] == 1
    assert results["gone:delete"] == {"op": "delete", "key": "gone", "version": 0,
                                      "old_value": "x", "deleted": True}
    assert results["never:delete"]["deleted"] is False
    b = await store_on.get_entry(scope, "b")
    assert (b.topic, b.version, b.expires_at is not None) == ("blue", 1, True)
    assert b.hash == results["b:set"]["hash"]
    assert await store_on.get(scope, "gone") is None
    events = await store_on.events(scope)
    mine = [e for e in events if e.tx == done["tx"]]
    assert [(e.type, e.key) for e in mine] == [
        ("state:created", "b"), ("state:updated", "a"), ("state:created", "c"),
        ("state:deleted", "gone")]
    assert {e.tx_size for e in mine} == {4} and mine[-1].revision == done["revision"]
    assert events[-4:] == mine  # consecutive, the last of the scope's


async def test_compare_chooses_the_branch(store_on: StateStore) -> None:
    scope = fresh("tx")
    await store_on.set(scope, "leader", "me")
    entry = await store_on.get_entry(scope, "leader")
    body: dict[str, Any] = {"scope": scope, "compare": [{"key": "leader", "expected_hash": entry.hash}],
                            "ops": [{"op": "set", "key": "term", "value": 1}],
                            "else_ops": [{"op": "set", "key": "lost", "value": True}]}
    held = await store_on.call("state::transaction", body)
    assert held["branch"] == "ops" and [r["key"] for r in held["results"]] == ["term"]
    await store_on.set(scope, "leader", "you")
    lost = await store_on.call("state::transaction", body)
    assert lost["branch"] == "else_ops" and [r["key"] for r in lost["results"]] == ["lost"]
    assert await store_on.get(scope, "term") == 1 and await store_on.get(scope, "lost") is True


async def test_a_hash_left_unknown_by_an_update_is_compared(store_on: StateStore) -> None:
    scope = fresh("tx")
    await store_on.call("state::update", {"scope": scope, "key": "k", "ops": [
        {"type": "set", "path": "a", "value": 1}]})  # (the stored hash is unknown after it)
    digest = hash_tree({"a": 1})
    done = await store_on.transaction(scope, [
        {"op": "check", "key": "k", "expected_hash": digest},
        {"op": "compare-and-set", "key": "k", "expected": {"a": 1}, "value": 2}])
    assert done["results"][1]["version"] == 2 and await store_on.get(scope, "k") == 2


async def test_refusals_before_anything_is_read(store_on: StateStore) -> None:
    scope = fresh("tx")
    duplicate = await failure(store_on, {"scope": scope, "ops": [
        {"op": "set", "key": "a", "value": 1}, {"op": "check", "key": "b", "absent": True},
        {"op": "delete", "key": "a"}]})
    assert duplicate.code == "DUPLICATE_KEY"
    assert (duplicate.details["first_index"], duplicate.details["op_index"]) == (0, 2)
    # a check on a key the list writes is a precondition, not a second write
    await store_on.transaction(scope, [{"op": "check", "key": "a", "absent": True},
                                       {"op": "set", "key": "a", "value": 1}])
    too_many = await failure(store_on, {"scope": scope, "ops": [
        {"op": "set", "key": f"k{n}", "value": n} for n in range(101)]})
    assert too_many.code == "INVALID_REQUEST" and too_many.details["limit"] == 100
    cases = [
        ({"op": "check", "key": "a"}, "$.ops[0]"),
        ({"op": "check", "key": "a", "expected_hash": "ABC"}, "$.ops[0].expected_hash"),
        ({"op": "check", "key": "a", "exists": True, "absent": True}, "$.ops[0]"),
        ({"op": "set", "key": "a", "value": 1, "ttl_ms": 0}, "$.ops[0].ttl_ms"),
        ({"op": "set", "key": "a", "value": 1, "expected_version": -1}, "$.ops[0].expected_version"),
        ({"op": "delete", "key": "a", "expected_version": 0}, "$.ops[0].expected_version"),
        ({"op": "set", "key": "a", "value": 1, "expected_versio": 1}, "$.ops[0].expected_versio"),
        ({"op": "rename", "key": "a"}, "$.ops[0].op"),
    ]
    for op, path in cases:
        error = await failure(store_on, {"scope": scope, "ops": [op]})
        assert error.code in ("INVALID_REQUEST", "UNKNOWN_FIELD"), (op, error)
        assert error.details["path"] == path and path in error.message, (op, error)
        if op["op"] == "rename":  # the kinds there are, named
            assert error.details["allowed"] == ["set", "update", "delete", "compare-and-set",
                                                "check"]
    no_compare = await failure(store_on, {"scope": scope, "ops": [], "else_ops": []})
    assert no_compare.details["path"] == "$.else_ops"
    empty = await failure(store_on, {"scope": scope, "ops": []})
    assert empty.details["path"] == "$.ops"
    long_key = await failure(store_on, {"scope": scope, "ops": [
        {"op": "set", "key": "k" * 2000, "value": 1}]})
    assert long_key.code == "KEY_TOO_LONG" and long_key.details["path"] == "$.ops[0].key"
    path_error = await failure(store_on, {"scope": scope, "ops": [{"op": "update", "key": "a", "ops": [
        {"type": "set", "path": "__proto__", "value": 1}]}]})
    assert path_error.code == "set.path.proto_polluted"
    assert path_error.details["path"] == "$.ops[0].ops[0]" and "$.ops[0].ops[0]:" in \
        path_error.message
    assert path_error.details["update_op_index"] == 0 and path_error.details["op_index"] == 0


async def test_the_key_limit_counts_every_key_the_transaction_creates(store_on: StateStore) -> None:
    scope = fresh("tx")
    await store_on.set(scope, "a", 1)
    full = await failure(store_on, {"scope": scope, "max_keys": 2, "ops": [
        {"op": "set", "key": "b", "value": 1}, {"op": "set", "key": "c", "value": 1}]})
    assert full.code == "KEY_LIMIT" and full.details["op_index"] == 0
    assert full.details["limit"] == 2 and full.details["live_keys"] == 1
    done = await store_on.transaction(scope, [
        {"op": "delete", "key": "a"}, {"op": "set", "key": "b", "value": 1},
        {"op": "set", "key": "c", "value": 1}], max_keys=2)
    assert [r["op"] for r in done["results"]] == ["delete", "set", "set"]
    assert await store_on.list_keys(scope) == ["b", "c"]


async def test_an_expired_key_reads_as_absent_and_a_failed_transaction_leaves_it(
        url: str, prefix: str) -> None:
    async with StateStore.open(url, prefix=prefix, partitions=4, reaper=False) as store:
        await expired_key_case(store)


async def expired_key_case(store_on: StateStore) -> None:
    scope = fresh("tx")
    await store_on.set(scope, "old", 1, ttl_ms=1)
    await store_on.set(scope, "other", 1)
    while await store_on.get(scope, "old") is not None:  # (its expiry passes within ms)
        pass
    before = [e.revision for e in await store_on.events(scope)]
    await failure(store_on, {"scope": scope, "ops": [
        {"op": "check", "key": "old", "absent": True},
        {"op": "check", "key": "other", "absent": True}]})
    assert [e.revision for e in await store_on.events(scope)] == before
    done = await store_on.transaction(scope, [{"op": "set", "key": "old", "value": 2,
                                               "create_only": True}])
    assert done["results"][0]["created"] is True and done["results"][0]["version"] == 1
    events = (await store_on.events(scope))[len(before):]
    assert [(e.type, e.tx) for e in events] == [("state:deleted", None),
                                                ("state:created", done["tx"])]
    # A transaction that changes nothing has no revision, even when it met an expired entry
    # (its drop is the reaper's event, not the transaction's).
    await store_on.set(scope, "brief", 1, ttl_ms=1)
    while await store_on.get(scope, "brief") is not None:
        pass
    checked = await store_on.transaction(scope, [{"op": "check", "key": "brief", "absent": True}])
    assert checked["revision"] is None
    assert (await store_on.events(scope))[-1].type == "state:deleted"


async def test_a_watch_never_stops_inside_a_transaction(url: str, prefix: str,
                                                        store_on: StateStore) -> None:
    """A watch reading 2 events a page hands on a 5-event transaction whole: its position
    (what a bookmark carries, where a resumed watch starts) is never inside one."""
    scope = fresh("tx")
    await store_on.set(scope, "start", 0)
    start = (await store_on.events(scope))[-1].revision
    txs = [await store_on.transaction(scope, [
        {"op": "set", "key": f"k{n}", "value": round_} for n in range(5)]) for round_ in range(3)]
    settings = Settings(redis_url=url, prefix=store_on.state.settings.prefix, partitions=4)
    async with Watch(url, settings, scope=scope, from_revision=start, page=2) as watch:
        seen: list[Any] = []
        async for item in watch:
            seen.append(item)
            last = next(tx["revision"] for tx in txs if tx["tx"] == item.tx)
            assert watch.position >= tuple(int(p) for p in last.split("-")), item
            if len(seen) == 15:
                break
    assert [e.tx for e in seen] == [tx["tx"] for tx in txs for _ in range(5)]
    # Resumed from inside the first transaction: its last three events, then the others whole
    # (the rest of a cut transaction is read by id, never into the next one).
    inside = seen[1].revision
    async with Watch(url, settings, scope=scope, from_revision=inside, page=2) as watch:
        resumed: list[Any] = []
        async for item in watch:
            resumed.append(item)
            if item.tx != txs[0]["tx"]:
                last = next(tx["revision"] for tx in txs if tx["tx"] == item.tx)
                assert watch.position >= tuple(int(p) for p in last.split("-")), item
            if len(resumed) == 13:
                break
    assert [e.revision for e in resumed] == [e.revision for e in seen[2:]]


async def test_a_retried_bus_call_gets_the_same_reply(store_on: StateStore) -> None:
    scope = fresh("tx")
    body = msgspec.json.encode({"scope": scope, "ops": [
        {"op": "update", "key": "n", "ops": [{"type": "increment", "path": "", "by": 1}]}]})
    bus = CallContext(call_id=uuid.uuid4().hex, call_digest="1" * 40)
    state = store_on.state
    first = await state.execute(functions.prepare(state, "state::transaction", body, bus))
    again = await state.execute(functions.prepare(state, "state::transaction", body, bus))
    assert msgspec.json.encode(first) == msgspec.json.encode(again)
    assert await store_on.get(scope, "n") == 1
