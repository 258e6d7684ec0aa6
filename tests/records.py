"""Where a bus call's record is, for the tests that look at records in Redis (the layout:
lua/includes/records.lua): the slice key holding it and its value."""

from __future__ import annotations

import time

import redis.asyncio as aredis

from stateworker.keys import KeySpace, call_field
from stateworker.scripts.bindings import DIGEST_BYTES, RECORD_SLICES
from stateworker.settings import Settings

WINDOW_MS = Settings().dedupe_window_ms


def slice_ms(window_ms: int = WINDOW_MS) -> int:
    return -(-window_ms // RECORD_SLICES)


async def record_of(raw: aredis.Redis, keys: KeySpace, call_id: str,
                    window_ms: int = WINDOW_MS) -> tuple[str, bytes] | None:
    """(slice key, value) of `call_id`'s record on one Redis, or None: the value is the
    call's digest (DIGEST_BYTES) and, when an entry script ran it, its reply (msgpack)."""
    ms = slice_ms(window_ms)
    current = int(time.time() * 1000) // ms
    field = call_field(call_id)
    for n in range(current + 1, current - RECORD_SLICES - 1, -1):
        name = keys.call_ids(field, n)
        value: bytes | None = await raw.hget(name, field)  # type: ignore[assignment]
        if value is not None:
            return name, value
    return None


async def reply_of(raw: aredis.Redis, keys: KeySpace, call_id: str,
                   window_ms: int = WINDOW_MS) -> bytes | None:
    """The recorded reply of `call_id` (msgpack), None without one."""
    found = await record_of(raw, keys, call_id, window_ms)
    if found is None or len(found[1]) <= DIGEST_BYTES:
        return None
    return found[1][DIGEST_BYTES:]
