"""What the bus tests that read replies off a reply list share: the entries drained, the
replies popped, and the check that calls left pending by a fault were each applied once and
answered from the record of that one run."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import redis.asyncio as aredis

from stateworker import StateStore


async def drained(raw: aredis.Redis, stream: str, group: str) -> bool:
    """Every entry of the stream acknowledged and deleted."""
    return (await raw.xpending(stream, group))["pending"] == 0 and await raw.xlen(stream) == 0


async def pop_replies(raw: aredis.Redis, reply: str, count: int, timeout: float = 30
                      ) -> list[bytes]:
    """`count` reply documents from `reply`, oldest first; fails after `timeout`."""
    documents: list[bytes] = []
    with anyio.fail_after(timeout):
        while len(documents) < count:
            popped = await raw.brpop([reply], timeout=1)
            if popped is not None:
                documents.append(popped[1])
    return documents


async def assert_increments_once(documents: list[bytes], ids: list[str], store: StateStore,
                                 scope: str) -> None:
    """The replies of `ids`, one increment of the scope's counter each: every call ok,
    answered from the record of its one run (the counter's values 1..n, one each), the
    counter at n and n events."""
    answers: list[Any] = [msgspec.json.decode(d) for d in documents]
    assert sorted(a["id"] for a in answers) == ids and all(a["ok"] for a in answers)
    assert sorted(a["result"]["results"][0]["new_value"]["n"] for a in answers) == list(
        range(1, len(ids) + 1))
    assert await store.get(scope, "counter") == {"n": len(ids)}
    assert len(await store.events(scope)) == len(ids)
