"""Expiry helpers of the Lua tests.

Short TTLs are never raced: a test that needs an entry expired waits for the clock to pass the
latest moment its expiry can be at (the write's end + ttl); what must still be alive has a TTL
of an hour. The expiry a write stored is read from the stored entry (state/kv/packed.py), which
reads do not filter."""

from __future__ import annotations

import anyio

from stateworker import StateStore
from stateworker.clock import now_ms
from stateworker.keys import member
from stateworker.state.kv.packed import unpack

HOUR_MS = 3_600_000


async def pass_time(until_ms: int) -> None:
    """Wait for the clock to pass `until_ms` (the condition under test is the clock itself)."""
    while now_ms() <= until_ms:
        await anyio.sleep((until_ms - now_ms() + 1) / 1000)


async def stored_expiry(store: StateStore, scope: str, key: str) -> int | None:
    """The expiry (epoch ms) in the stored entry, expired or not; None: no expiry. Checked
    against the partition's ttl index."""
    part = store.state.keys.for_scope(scope)
    expires = unpack(await store.state.conn.execute("GET", part.entry(scope, key))).expires
    score = await store.state.conn.execute("ZSCORE", part.ttl, member(scope, key))
    assert (expires is None) == (score is None), (expires, score)
    if expires is None:
        return None
    assert int(float(score)) == expires
    return expires


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
