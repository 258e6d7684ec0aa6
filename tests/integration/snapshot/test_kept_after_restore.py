"""The kept replies of writes that run no entry script through a wipe of Redis and a restore
(decision 0061, snapshot/kept.py): a retry of such a call whose writes PostgreSQL holds gets
its first reply and changes nothing; one whose writes PostgreSQL does not hold runs again.

The first test runs a service and `stateworker restore`: delete-by-topic, a barrier arrival,
delete-barrier, register-trigger and create-index, each followed by a write it would undo if
run again (a key written with the topic, the barrier begun again, the trigger unregistered,
the index dropped). The others drive the snapshotter's steps by hand, so that the round that
stores kept replies comes before the commit of their writes: the record stays out of
PostgreSQL, and the retry after the restore runs the write again."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, call_field
from tests.integration.busproto import until
from tests.integration.snapshot.driven import (
    arrival,
    as_json,
    bus_call,
    nothing_unsaved,
    opened,
    round_before_the_batch,
    stored_calls,
)
from tests.integration.snapshot.test_older_copy_between_rounds import stepped, steps_until
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshot.test_restore import restore_command
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

TRIGGER = {"id": "t1", "function_id": "reactor::on_change", "service": "reactor",
           "config": {"scope": "s1"}}
INDEX = {"scope": "ix", "pointer": "/n"}
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("k-dbt", "state::delete-by-topic", {"scope": "dt", "topic_pattern": "t"}),
    ("k-arrive", "state::barrier", {"event": {"key": "x"},
                                    "condition_config": {"id": "one", "expect": 2}}),
    ("k-delbar", "state::delete-barrier", {"id": "bar"}),
    ("k-trig", "state::register-trigger", TRIGGER),
    ("k-idx", "state::create-index", INDEX),
]
CONFIG = ("k-cfg", "state::on-config-change", {})  # (its writes: in Redis alone)


async def test_step_writes_retried_after_a_restore_get_their_kept_reply(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    first: dict[str, Any] = {}
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as bus:
        await bus.call("state::set", {"scope": "dt", "key": "a", "value": 1, "topic": "t"})
        await bus.call("state::barrier", arrival("bar", "a"))
        for call_id, fn, body in [*CALLS, CONFIG]:
            first[call_id] = await bus.call(fn, body, call_id=call_id)
        # What each would undo, run again.
        await bus.call("state::set", {"scope": "dt", "key": "b", "value": 2, "topic": "t"})
        await bus.call("state::delete-barrier", {"id": "one"})
        await bus.call("state::barrier", arrival("bar", "a"))
        await bus.call("state::unregister-trigger", {"id": "t1"})
        await bus.call("state::drop-index", INDEX)
        await until(lambda: nothing_unsaved(client, keys), 60, "the snapshot to catch up")
    assert first["k-dbt"] == {"deleted": 1} and first["k-delbar"] == {"deleted": True}
    held = stored_calls(postgres_url, prefix)
    assert {call_field(call_id) for call_id, _, _ in CALLS} <= held
    assert call_field(CONFIG[0]) not in held  # (PostgreSQL never holds the live settings)

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as bus:
        for call_id, fn, body in CALLS:
            assert await bus.call(fn, body, call_id=call_id) == first[call_id], call_id
        entry = await bus.call("state::get-entry", {"scope": "dt", "key": "b"})
        assert (entry["value"], entry["version"]) == (2, 1)  # not deleted again
        # `bar` begun again since its deletion keeps its arrival; `one` is not begun again.
        assert (await bus.call("state::barrier", arrival("bar", "b")))["decision"] == "allow"
        assert (await bus.call("state::barrier", arrival("one", "y")))["decision"] != "allow"
        assert (await bus.call("state::list-triggers", {}))["triggers"] == []
        assert (await bus.call("state::list-indexes", {"scope": "ix"}))["indexes"] == []


async def retried_after_a_restore(own_redis: RedisServer, prefix: str, postgres_url: str,
                                  before: list[tuple[str, dict[str, Any]]],
                                  call: tuple[str, str, dict[str, Any]]) -> tuple[Any, Any]:
    """`before` committed, then `call` made and the kept-reply step run before its writes
    are committed: its record stays out of PostgreSQL. Redis wiped, the snapshot restored
    (the repair at start), the call retried: its first reply and the retry's."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    call_id, fn, body = call
    home = keys.id_home(call_field(call_id))
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        for n, (name, args) in enumerate(before):
            await bus_call(state, name, args, f"before-{n}")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the writes before",
                          rounds=True)
        first = await bus_call(state, fn, body, call_id)
        assert client.xlen(keys.partition(home).unsaved_kept) == 1
        await round_before_the_batch(snap, home)
        assert call_field(call_id) not in stored_calls(postgres_url, prefix)
    client.flushall()
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        again = await bus_call(state, fn, body, call_id)
        return first, again


async def test_a_delete_by_topic_whose_deletes_were_not_committed_runs_again(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    first, again = await retried_after_a_restore(
        own_redis, prefix, postgres_url,
        [("state::set", {"scope": "dt", "key": "a", "value": 1, "topic": "t"})], CALLS[0])
    assert as_json(first) == as_json(again) == {"deleted": 1}  # `a` came back, and is deleted again
    async with opened(settings) as state:
        assert as_json(await bus_call(state, "state::get", {"scope": "dt", "key": "a"}, "g")) is None


async def test_a_barrier_deletion_not_stored_runs_again(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    first, again = await retried_after_a_restore(
        own_redis, prefix, postgres_url, [("state::barrier", arrival("bar", "a"))], CALLS[2])
    assert as_json(first) == as_json(again) == {"deleted": True}  # `bar` came back, deleted again
    async with opened(settings) as state:
        decided = await bus_call(state, "state::barrier", arrival("bar", "b"), "b")
        assert as_json(decided)["decision"] != "allow"  # a barrier begun anew: `a` is gone


async def test_a_trigger_registration_not_copied_runs_again(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    first, again = await retried_after_a_restore(
        own_redis, prefix, postgres_url, [("state::register-trigger", {**TRIGGER, "id": "t0"})],
        CALLS[3])
    assert as_json(first) == as_json(again)
    async with opened(settings) as state:
        listed = await bus_call(state, "state::list-triggers", {}, "l")
        assert sorted(t["id"] for t in as_json(listed)["triggers"]) == ["t0", "t1"]  # t1 again


async def test_the_live_settings_keep_their_reply_in_redis_alone(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """PostgreSQL never holds what on-config-change writes: its record never goes there."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        await bus_call(state, *CONFIG[1:], CONFIG[0])
        assert not any(client.xlen(p.unsaved_kept) for p in keys.all_partitions())
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the registry copied",
                          rounds=True)
    assert call_field(CONFIG[0]) not in stored_calls(postgres_url, prefix)


async def test_a_restore_onto_kept_streams_drops_the_kept_replies_waiting(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """A Redis that lost its entries but kept its streams (the events, the kept replies
    waiting) is restored: the positions move to the streams' ends, so a record waiting from
    before would now read as covered, and PostgreSQL would hold the reply of a call whose
    writes it does not hold (a retry after the next restore: the reply, the write never
    made). The restore drops the waiting ones: the call has no record, its retry runs."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    call_id, fn, body = CALLS[0]  # delete-by-topic: deletes `a`, not committed
    home = keys.id_home(call_field(call_id))
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        await bus_call(state, "state::set", {"scope": "dt", "key": "a", "value": 1, "topic": "t"},
                       "before")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the write before",
                          rounds=True)
        assert as_json(await bus_call(state, fn, body, call_id)) == {"deleted": 1}
        assert client.xlen(keys.partition(home).unsaved_kept) == 1
        await round_before_the_batch(snap, home)
    streams = [k for k in client.scan_iter(match=f"{prefix}*") if client.type(k) == b"stream"]
    kept = [k for k in client.scan_iter(match=f"{prefix}*") if k not in streams]
    assert keys.partition(home).unsaved_kept.encode() in streams
    client.delete(*kept)  # (the entries, the markers, the positions: gone; the streams stay)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        assert not client.xlen(keys.partition(home).unsaved_kept)
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the restore stored",
                          rounds=True)
        assert call_field(call_id) not in stored_calls(postgres_url, prefix)
        assert as_json(await bus_call(state, fn, body, call_id)) == {"deleted": 1}  # runs again
        assert as_json(await bus_call(state, "state::get", {"scope": "dt", "key": "a"}, "g")) \
            is None
