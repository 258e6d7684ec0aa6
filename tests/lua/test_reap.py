"""Expiry: the TTL reaper (reap.lua) deletes expired entries in bounded batches, each with its
state:deleted event; before it comes, an expired entry reads as missing at once, and a write
that meets one deletes it first, with the event the reaper would write."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateStore
from stateworker.clock import now_ms
from stateworker.errors import InternalError
from stateworker.state import expiry
from stateworker.transport.connection import RedisConnection
from tests.calls import INCREMENT
from tests.lua.ttl import HOUR_MS, expiring, pass_time
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_reaper_deletes_in_bounded_batches(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=1, reaper=False,
                               reaper_batch=10) as store:
        keys = [f"k{i:02d}" for i in range(35)]
        until = await expiring(store, scope, keys)
        await store.set(scope, "stays", 0, ttl_ms=HOUR_MS)
        await pass_time(until)
        part = store.state.keys.partition(0)
        assert await expiry.reap_partition(store.state, part) == (10, True)
        assert await store.reap_expired() == 25
        assert await store.reap_expired() == 0
        deleted = [e for e in await store.events(scope) if e.type == "state:deleted"]
        assert sorted(e.key for e in deleted) == keys
        for event in deleted:  # what was deleted: the value, its version, no writer
            assert bytes(event.old_value) == msgspec.json.encode(event.key), event
            assert (bytes(event.new_value), event.version, event.by) == (b"null", 1, "")
        assert await store.list_keys(scope) == ["stays"]
        assert scope in await store.list_groups()


async def test_one_reaper_round_reaps_past_every_batch(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    """The reaper's round sends every partition's first batch, the old writes' forgetting and
    the expired triggers' removal in one pipeline, then goes on where a batch was not all."""
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=2, reaper=False,
                               reaper_batch=10) as store:
        tags = {store.state.keys.for_scope(f"{scope}-{i}").tag: f"{scope}-{i}" for i in range(9)}
        scopes = sorted(tags.values())  # one in each of the two partitions
        assert len(scopes) == 2
        until = max([await expiring(store, s, [f"k{i:02d}" for i in range(25)]) for s in scopes])
        await store.call("state::register-trigger", {
            "id": "leased", "function_id": "reactor::on", "service": "reactor", "ttl_ms": 500})
        await pass_time(max(until, now_ms() + 500))
        await expiry.reaper_round(store.state)
        for s in scopes:
            assert sorted(e.key for e in await store.events(s) if e.type == "state:deleted"
                          ) == [f"k{i:02d}" for i in range(25)]
        assert await store.state.conn.execute("HLEN", store.state.keys.triggers) == 0


async def test_a_partition_whose_reap_fails_holds_up_no_other_in_its_round(
    redis_server: RedisServer, prefix: str
) -> None:
    """Partition 0's ttl index is broken (a string: reap.lua fails on WRONGTYPE). The round
    still fails (the loop logs it), but only after the other partitions were reaped past
    their first share of the batch: one broken partition does not slow every other one to
    a share of a batch per round."""
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4, reaper=False,
                               reaper_batch=5) as store:
        keys = store.state.keys
        scopes: dict[int, str] = {}
        n = 0
        while len(scopes) < 4:
            scopes.setdefault(keys.partition_of(f"s{n}"), f"s{n}")
            n += 1
        healthy = [scopes[p] for p in (1, 2, 3)]
        names = [f"k{i:02d}" for i in range(12)]
        until = max([await expiring(store, s, names) for s in healthy])
        await store.state.conn.execute("SET", keys.partition(0).ttl, "broken")
        await pass_time(until)
        with pytest.raises(InternalError, match="WRONGTYPE"):
            await expiry.reaper_round(store.state)
        for s in healthy:
            assert sorted(e.key for e in await store.events(s) if e.type == "state:deleted"
                          ) == names, s


async def test_a_round_holds_redis_for_about_one_batch_not_one_per_partition(
    redis_server: RedisServer, prefix: str
) -> None:
    """reaper_batch bounds how long a reap keeps Redis from serving anyone else. A pipeline
    runs in Redis back to back, other clients' commands only between its reads: a round
    whose pipeline asks every partition for a full batch held every client for partitions x
    reaper_batch deletions (16 x 200 by default: ~100 ms against one batch's ~5). Another
    client counting the expired entries left, command after command, sees them drop by
    about a batch at a time."""
    partitions, batch, per_partition = 16, 50, 120
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=partitions,
                               reaper=False, reaper_batch=batch) as store:
        keys = store.state.keys
        scopes: dict[int, str] = {}
        n = 0
        while len(scopes) < partitions:
            scopes.setdefault(keys.partition_of(f"s{n}"), f"s{n}")
            n += 1
        async with anyio.create_task_group() as tg:
            for s in scopes.values():
                for i in range(per_partition):
                    tg.start_soon(functools.partial(store.set, s, f"k{i}", i, ttl_ms=30))
        await pass_time(now_ms() + 30)
        other = RedisConnection(redis_server.url)
        counting = [["ZCARD", part.ttl] for part in keys.all_partitions()]
        left: list[int] = []
        done = anyio.Event()

        async def count() -> None:
            while not done.is_set():
                left.append(sum(await other.pipeline(counting)))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(count)
                with anyio.fail_after(10):
                    while len(left) < 2:
                        await anyio.sleep(0)  # (the counter's first replies)
                await expiry.reaper_round(store.state)
                done.set()
            left.append(sum(await other.pipeline(counting)))  # (after the round)
        finally:
            await other.close()
        assert left[0] == partitions * per_partition and left[-1] == 0
        drops = [a - b for a, b in itertools.pairwise(left)]
        assert max(drops) <= 3 * batch, drops


async def test_background_reaper_emits_deleted(store: StateStore, scope: str) -> None:
    until = await expiring(store, scope, ["a"])
    await pass_time(until)
    with anyio.fail_after(10):
        while not (deleted := [e for e in await store.events(scope)
                               if e.type == "state:deleted"]):
            await anyio.sleep(0.05)  # polling the event stream for the reaper's event
    assert [(e.key, bytes(e.old_value), bytes(e.new_value), e.version, e.by)
            for e in deleted] == [("a", b'"a"', b"null", 1, "")]
    assert scope not in await store.list_groups()


# ---- expired entries before the reaper came --------------------------------------------------
async def test_expired_entry_reads_as_missing_before_reaping(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        await store.set(scope, "keep", 1)
        await store.set(scope, "later", 2, ttl_ms=HOUR_MS)
        until = await expiring(store, scope, ["gone"])
        await pass_time(until)
        assert await store.get(scope, "gone") is None
        assert (await store.get_entry(scope, "gone")).found is False
        assert await store.get(scope, "later") == 2  # not expired yet
        assert await store.list(scope) == [1, 2]
        assert await store.list_keys(scope) == ["keep", "later"]
        cas = await store.compare_and_set(scope, "gone", "new")
        assert cas.swapped is True
        types = [(e.type, e.key, e.version, bytes(e.old_value)) for e in await store.events(scope)]
        # the expired entry is deleted (with its event) before the new one is created
        assert types[-2:] == [("state:deleted", "gone", 1, b'"gone"'),
                              ("state:created", "gone", 1, b"null")]


async def test_a_scope_whose_every_entry_expired_is_not_listed_before_reaping(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    """list_groups, list-namespaces and moco's list_namespaces list the scopes that hold an
    entry; an expired one reads as missing, so a scope holding only expired entries is not
    listed, also before the reaper drops it from the scopes index (it once was, until then).
    A scope with one live entry beside its expired ones is listed."""
    gone, mixed = f"{scope}-gone", f"{scope}-mixed"
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        until = max(await expiring(store, gone, ["a", "b"]), await expiring(store, mixed, ["a"]))
        await store.set(mixed, "live", 1, ttl_ms=HOUR_MS)
        await store.set("global-list", "k", 1)  # (moco's in_global_ns lists names without ':')
        await pass_time(until)
        assert await store.list_groups() == sorted(["global-list", mixed])
        listed = await store.call("state::list-namespaces", {})
        assert listed == {"namespaces": sorted(["global-list", mixed])}
        moco = await store.call("builtin.state.list_namespaces", {"in_global_ns": True},
                                context={"user_id": "u"})
        assert moco == sorted(["global-list", mixed])
        assert await store.reap_expired() == 3  # (they were there, expired, all along)


async def test_a_write_meeting_an_expired_entry_deletes_it_first(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    """set, update, delete and update-topic (beyond compare-and-set) on an entry whose expiry
    passed before the reaper came: the entry is deleted with its state:deleted event (no
    writer, as the reaper's) before the write goes on as on a missing key."""
    writes: dict[str, tuple[dict[str, Any], Any, list[tuple[str, str, str, int, str]]]] = {
        # function: (request, reply, events after the deletion)
        "state::set": ({"value": "new"}, {"old_value": None, "new_value": "new", "version": 1,
                                         "created": True},
                       [("state:created", "null", '"new"', 1, "w")]),
        "state::update": ({"ops": INCREMENT}, {"old_value": None, "new_value": {"n": 1},
                                               "version": 1},
                          [("state:created", "null", '{"n":1}', 1, "w")]),
        "state::delete": ({}, None, []),
        "state::update-topic": ({"topic": "x"}, {"updated": False}, []),
    }
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        expired_by = 0
        for fn in writes:
            await store.set(scope, fn, f"old {fn}", topic="t", ttl_ms=30)
            expired_by = now_ms() + 30
        await pass_time(expired_by)
        part = store.state.keys.for_scope(scope)
        for fn, (body, expected, after) in writes.items():
            mark = (await store.events(scope))[-1].revision
            result = await store.call(fn, {"scope": scope, "key": fn, **body}, caller="w")
            if fn == "state::set":
                result = {k: v for k, v in result.items() if k != "hash"}
            assert result == expected, fn
            events = [(e.type, bytes(e.old_value).decode(), bytes(e.new_value).decode(),
                       e.version, e.by) for e in await store.events(scope, mark)]
            assert events == [
                ("state:deleted", msgspec.json.encode(f"old {fn}").decode(), "null", 1, ""),
                *after], fn
        assert await store.list_keys(scope) == ["state::set", "state::update"]
        assert await store.state.conn.execute("ZCARD", part.ttl) == 0  # no expiry left behind
        page = await store.call("state::list-entries", {"scope": scope, "topic_pattern": "t"})
        assert page["entries"] == []  # set replaces the topic; update of a new entry has none
        assert await store.reap_expired() == 0  # nothing left for the reaper
