"""Expiry: an expired entry reads as missing at once; the reaper deletes it with an event."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateStore
from stateworker.clock import now_ms
from stateworker.state import expiry
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def pass_time(until_ms: int) -> None:
    """Wait for the clock to pass `until_ms` (the condition under test is the clock itself)."""
    while now_ms() <= until_ms:
        await anyio.sleep((until_ms - now_ms() + 1) / 1000)


async def expiring(store: StateStore, scope: str, keys: list[str], ttl_ms: int = 30) -> int:
    expires = 0
    for key in keys:
        await store.set(scope, key, key, ttl_ms=ttl_ms)
        entry = await store.get_entry(scope, key)
        assert entry.expires_at is not None
        expires = now_ms() + ttl_ms
    return expires


async def test_expired_entry_reads_as_missing_before_reaping(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        await store.set(scope, "keep", 1)
        until = await expiring(store, scope, ["gone"])
        assert await store.get(scope, "gone") == "gone"
        await pass_time(until)
        assert await store.get(scope, "gone") is None
        assert (await store.get_entry(scope, "gone")).found is False
        assert await store.list(scope) == [1]
        assert await store.list_keys(scope) == ["keep"]
        cas = await store.compare_and_set(scope, "gone", "new")
        assert cas.swapped is True
        types = [(e.type, e.key, e.version) for e in await store.events(scope)]
        # the expired entry is deleted (with its event) before the new one is created
        assert types[-2:] == [("state:deleted", "gone", 1), ("state:created", "gone", 1)]


async def test_reaper_deletes_in_bounded_batches(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=1, reaper=False,
                               reaper_batch=10) as store:
        keys = [f"k{i:02d}" for i in range(35)]
        until = await expiring(store, scope, keys)
        await store.set(scope, "stays", 0, ttl_ms=3_600_000)
        await pass_time(until)
        part = store.state.keys.partition(0)
        assert await expiry.reap_partition(store.state, part) == (10, True)
        assert await store.reap_expired() == 25
        assert await store.reap_expired() == 0
        deleted = [e for e in await store.events(scope) if e.type == "state:deleted"]
        assert sorted(e.key for e in deleted) == keys
        assert all(e.by == "" and bytes(e.new_value) == b"null" for e in deleted)
        assert await store.list_keys(scope) == ["stays"]
        assert scope in await store.list_groups()


async def test_background_reaper_emits_deleted(store: StateStore, scope: str) -> None:
    until = await expiring(store, scope, ["a"])
    await pass_time(until)
    with anyio.fail_after(10):
        while not any(e.type == "state:deleted" for e in await store.events(scope)):
            await anyio.sleep(0.05)  # polling the event stream for the reaper's event
    assert scope not in await store.list_groups()


async def test_set_without_ttl_clears_expiry(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        until = await expiring(store, scope, ["k"])
        await store.set(scope, "k", "kept")
        await pass_time(until)
        assert await store.reap_expired() == 0
        assert await store.get(scope, "k") == "kept"
