"""The partition reader: a scope's events are found behind any number of other scopes' events,
in revision order, and a reader resumes from the cursor it returned."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateStore
from stateworker.events.reader import PartitionReader
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_three_events_behind_twenty_thousand_of_other_scopes(
        redis_server: RedisServer, prefix: str) -> None:
    # One partition: every scope's events share one stream.
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=1,
                               reaper=False) as store:
        async def others(task: int) -> None:
            for i in range(1000):
                await store.set(f"other-{task}", f"k{i}", i)

        async with anyio.create_task_group() as tg:
            for task in range(20):
                tg.start_soon(others, task)
        for version in (1, 2, 3):
            await store.set("mine", "k", version)

        state = store.state
        assert await state.conn.execute("XLEN", state.keys.partition(0).events) == 20_003
        reader = PartitionReader(state.conn, state.keys, 0, scope="mine")
        found, cursor, pages = [], "-", 0
        while True:
            page = await reader.page(cursor, count=1000)  # 1,000 examined per round trip
            found += page.events
            cursor, pages = page.cursor, pages + 1
            if page.done:
                break
        assert pages == 21
        assert [(e.type, e.key, bytes(e.new_value), e.version) for e in found] == [
            ("state:created", "k", b"1", 1), ("state:updated", "k", b"2", 2),
            ("state:updated", "k", b"3", 3)]
        revisions = [e.revision for e in found]
        assert revisions == sorted(revisions, key=lambda r: tuple(map(int, r.split("-"))))
        assert cursor == revisions[-1]  # the last entry examined is the last event

        # The store's own read of a scope goes past the other scopes too.
        assert [e.revision for e in await store.events("mine")] == revisions

        # Resume from the cursor: only what came after it, nothing read twice.
        await store.set("other-0", "late", 1)
        await store.delete("mine", "k")
        more = await reader.read_all(cursor)
        assert [(e.type, e.version) for e in more.events] == [("state:deleted", 3)]
        assert more.done and more.cursor > cursor
        again = await reader.read_all(more.cursor)
        assert again.events == [] and again.cursor == more.cursor


async def test_a_key_filter_and_an_empty_stream(redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=1,
                               reaper=False) as store:
        state = store.state
        empty = await PartitionReader(state.conn, state.keys, 0).page()
        assert empty.events == [] and empty.cursor == "-" and empty.done
        for key in ("a", "b", "a"):
            await store.set("s", key, key)
        reader = PartitionReader(state.conn, state.keys, 0, scope="s", key="a")
        page = await reader.read_all()
        assert [(e.key, e.version) for e in page.events] == [("a", 1), ("a", 2)]
