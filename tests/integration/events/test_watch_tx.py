"""An unscoped watch hands a transaction on whole across partitions: when another partition's
read stops inside the millisecond of a transaction, the transaction's events wait until every
partition has been read past its last one, so the watch's position (what a bookmark carries,
where a resumed watch starts) is never inside it. The streams are written with explicit ids,
so the interleaving is exact."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.events.model import Event
from stateworker.events.watch import Watch
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def event_fields(key: str, tx: str | None = None) -> dict[str, str]:
    fields = {"type": "state:created", "scope": "s", "key": key, "old_value": "null",
              "new_value": "1", "version": "1", "ts_ms": "5000", "by": ""}
    return fields if tx is None else {**fields, "tx": tx, "tx_size": "5"}


async def test_an_unscoped_watch_never_stops_inside_a_transaction(redis_server: RedisServer,
                                                                  prefix: str) -> None:
    keys = KeySpace(prefix, 2)
    raw = aredis.Redis.from_url(redis_server.url)
    try:
        for seq in range(1, 6):  # partition 0: one transaction, 5000-1 .. 5000-5
            await raw.xadd(keys.partition(0).events, event_fields(f"t{seq}", "T"),
                           id=f"5000-{seq}")
        for seq in (2, 4, 6, 8):  # partition 1: plain events in between and after
            await raw.xadd(keys.partition(1).events, event_fields(f"p{seq}"), id=f"5000-{seq}")
    finally:
        await raw.aclose()
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=2)
    seen: list[Event] = []
    async with Watch(redis_server.url, settings, from_revision="0", page=2) as watch:
        async for item in watch:
            assert isinstance(item, Event)
            seen.append(item)
            if item.tx is not None:  # its page is read at 5000-4 at first: it waits
                assert watch.position >= (5000, 5), (item.revision, watch.position)
            if len(seen) == 9:
                break
    assert [e.revision for e in seen] == [f"5000-{n}" for n in (1, 2, 2, 3, 4, 4, 5, 6, 8)]
