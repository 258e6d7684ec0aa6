"""A blocking read of streams in different slots (transport/streamread.py), on one server and
on the cluster: entries of every stream come back in the order the streams were named, a read
blocked on several slots returns when ONE of them gets an entry (not when its BLOCK runs out),
entries already waiting are read without blocking at all,
and an XREADGROUP whose other reads were ended delivered nothing there: no entry is left
pending unseen."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

from stateworker.transport.connect import connection_for
from stateworker.transport.slots import key_slot
from stateworker.transport.streamread import StreamReader
from stateworker.transport.wire import ConnectionLost
from tests.cluster import RedisCluster

pytestmark = pytest.mark.anyio

LONG_BLOCK_MS = 60_000  # far longer than the test's bound: only an entry can end the wait


def streams_of(prefix: str) -> list[str]:
    names = [f"{prefix}:s:{{{prefix}:t{n}}}" for n in range(3)]
    assert len({key_slot(name) for name in names}) == 3
    return names


async def test_a_read_over_slots_merges_and_wakes_on_one(url: str, prefix: str) -> None:
    streams = streams_of(prefix)
    writer = connection_for(url)
    reader = StreamReader(connection_for(url))
    try:
        for stream in streams:
            await writer.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
        await writer.execute("XADD", streams[2], "*", "n", "2")
        await writer.execute("XADD", streams[0], "*", "n", "0")
        head = ["XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "BLOCK", LONG_BLOCK_MS]
        with anyio.fail_after(10):
            got = await reader.read(head, streams, [">"] * 3)
        assert got is not None
        assert [name.decode() for name, _ in got] == [streams[0], streams[2]]
        # entries were waiting: found by a read without BLOCK, no read blocked (none to end)
        assert not reader._lanes

        async def add_later() -> None:
            await writer.execute("XADD", streams[1], "*", "n", "1")

        async with anyio.create_task_group() as tg:
            with anyio.fail_after(10):  # blocked on three slots: one entry ends the wait
                tg.start_soon(add_later)
                got = await reader.read(head, streams, [">"] * 3)
        assert got is not None and [name.decode() for name, _ in got] == [streams[1]]
        # The other slots' reads were ended without delivering: nothing pending but what
        # was read.
        for stream, expected in zip(streams, (1, 1, 1), strict=True):
            summary = await writer.execute("XPENDING", stream, "g")
            assert summary[0] == expected, stream
        await writer.execute("XADD", streams[0], "*", "n", "3")
        with anyio.fail_after(10):
            got = await reader.read(head, streams, [">"] * 3)
        assert got is not None and [name.decode() for name, _ in got] == [streams[0]]
    finally:
        await reader.close()
        await writer.close()


async def test_a_read_over_slots_finds_a_stream_whose_primary_failed_over(
        redis_cluster: RedisCluster, prefix: str) -> None:
    """A primary killed: its replica is promoted, and the next reads go to it (the map is
    read again after the lost connection), not to the dead node until it comes back."""
    streams = streams_of(prefix)
    writer = connection_for(redis_cluster.urls)
    reader = StreamReader(connection_for(redis_cluster.urls))
    head = ["XREAD", "COUNT", 10, "BLOCK", 100]
    try:
        for stream in streams:
            await writer.execute("XADD", stream, "*", "n", "0")
        assert len(await reader.read(head, streams, ["0-0"] * 3) or []) == 3
        slot = key_slot(streams[0])
        victim = redis_cluster.owner(slot)
        redis_cluster.kill_node(victim.port)
        try:
            await anyio.to_thread.run_sync(redis_cluster.promoted, slot, victim.port)
            with anyio.fail_after(30):  # (a read or two meet the lost primary first)
                while True:
                    try:
                        got = await reader.read(head, streams, ["0-0"] * 3)
                        break
                    except ConnectionLost:
                        await anyio.sleep(0.1)
            assert got is not None and len(got) == 3
        finally:  # (the shared cluster left 3+3)
            await anyio.to_thread.run_sync(redis_cluster.restart_node, victim.port)
    finally:
        await reader.close()
        await writer.close()
