"""Expiry: an expired entry reads as missing at once; the reaper deletes it with an event.

Short TTLs are never raced: a test that needs an entry expired waits for the clock to pass the
latest moment its expiry can be at (the write's end + ttl); what must still be alive has a TTL
of an hour. The expiry a write stored is read from the entry's hash (`x`), which reads do not
filter."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from stateworker import StateStore
from stateworker.clock import now_ms
from stateworker.keys import member
from stateworker.state import expiry
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

HOUR_MS = 3_600_000


async def pass_time(until_ms: int) -> None:
    """Wait for the clock to pass `until_ms` (the condition under test is the clock itself)."""
    while now_ms() <= until_ms:
        await anyio.sleep((until_ms - now_ms() + 1) / 1000)


async def stored_expiry(store: StateStore, scope: str, key: str) -> int | None:
    """The expiry (epoch ms) in the entry's hash, expired or not; None: no expiry. Checked
    against the partition's ttl index."""
    part = store.state.keys.for_scope(scope)
    raw = await store.state.conn.execute("HGET", part.entry(scope, key), "x")
    score = await store.state.conn.execute("ZSCORE", part.ttl, member(scope, key))
    assert (raw is None) == (score is None), (raw, score)
    if raw is None:
        return None
    assert int(float(score)) == int(raw)
    return int(raw)


async def expiring(store: StateStore, scope: str, keys: list[str], ttl_ms: int = 30) -> int:
    """Write `keys` (value: the key) with `ttl_ms`; returns a time by which all have expired."""
    latest = 0
    for key in keys:
        before = now_ms()
        await store.set(scope, key, key, ttl_ms=ttl_ms)
        after = now_ms()
        expires = await stored_expiry(store, scope, key)
        assert expires is not None and before + ttl_ms <= expires <= after + ttl_ms
        latest = max(latest, expires)
    return latest


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


async def test_set_without_ttl_clears_expiry(store: StateStore, scope: str) -> None:
    await store.set(scope, "k", "first", ttl_ms=HOUR_MS)
    assert await stored_expiry(store, scope, "k") is not None
    await store.set(scope, "k", "kept")
    assert await stored_expiry(store, scope, "k") is None
    assert (await store.get_entry(scope, "k")).expires_at is None


async def test_update_sets_and_keeps_expiry(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    increment = [{"type": "increment", "path": "n", "by": 1}]
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        async def update(key: str, **extra: int) -> None:
            await store.call("state::update", {"scope": scope, "key": key, "ops": increment,
                                               **extra})

        await store.set(scope, "k", {"n": 0})
        before = now_ms()
        await update("k", ttl_ms=HOUR_MS)  # a ttl on an entry that had none
        after = now_ms()
        first = await stored_expiry(store, scope, "k")
        assert first is not None and before + HOUR_MS <= first <= after + HOUR_MS
        assert (await store.get_entry(scope, "k")).expires_at is not None
        await update("k")  # no ttl_ms: the expiry stays as it was
        assert await stored_expiry(store, scope, "k") == first
        before = now_ms()
        await update("k", ttl_ms=2 * HOUR_MS)  # a new ttl: from now
        after = now_ms()
        second = await stored_expiry(store, scope, "k")
        assert second is not None and before + 2 * HOUR_MS <= second <= after + 2 * HOUR_MS
        assert await store.get(scope, "k") == {"n": 3}
        # an update that creates the entry sets its ttl too, and the entry does expire
        before = now_ms()
        await update("short", ttl_ms=30)
        after = now_ms()
        expires = await stored_expiry(store, scope, "short")
        assert expires is not None and before + 30 <= expires <= after + 30
        await pass_time(expires)
        assert await store.get(scope, "short") is None
        assert await store.reap_expired() == 1
        assert [(e.type, e.key, bytes(e.old_value)) for e in await store.events(scope)
                if e.key == "short"] == [("state:created", "short", b"null"),
                                         ("state:deleted", "short", b'{"n":1}')]
