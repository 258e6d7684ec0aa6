"""Helpers of the listing tests: a scope filled with entries, and every page of a
state::list-entries walk."""

from __future__ import annotations

from typing import Any

import anyio

from stateworker import StateStore


async def fill(store: StateStore, scope: str, count: int) -> list[str]:
    """`count` entries; topics t0..t4 on most, none on every 7th; writes run concurrently."""
    keys = [f"k{i:05d}" for i in range(count)]

    async def writer(chunk: list[str]) -> None:
        for key in chunk:
            i = int(key[1:])
            topic = None if i % 7 == 0 else f"t{i % 5}"
            await store.set(scope, key, i, topic=topic)

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(writer, keys[n::50])
    return keys


async def walk(store: StateStore, body: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    after = None
    while True:
        page = await store.call("state::list-entries", {**body, **({"after": after} if after else {})})
        entries += page["entries"]
        after = page.get("next_after")
        if after is None:
            return entries
