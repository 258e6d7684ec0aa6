"""droptarget.lua (reactive/targets.py): a trigger target's call stream is removed only when it
holds no call and no group of it has a consumer; any other stream is kept, and a name of
another type or no stream at all is left as it is."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from stateworker.scripts.upkeep_bindings import DROPTARGET, bus_library, droptarget_call
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection
from stateworker.transport.plans import pipeline
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def conn(redis_server: RedisServer) -> AsyncIterator[RedisConnection]:
    opened = connection_for(redis_server.url)
    yield opened
    await opened.close()


async def drop(conn: RedisConnection, stream: str) -> int:
    library = bus_library(conn)
    (reply,) = await pipeline(conn, library, [DROPTARGET.command(library,
                                                                 *droptarget_call(stream))])
    return DROPTARGET.read(reply).number


async def test_each_kind_of_stream(conn: RedisConnection, raw: aredis.Redis, prefix: str
                                   ) -> None:
    empty, calls, served, other = (f"{prefix}:bus:{n}" for n in ("empty", "calls", "served",
                                                                   "other"))
    for stream in (empty, calls, served):
        await raw.xgroup_create(stream, "g", "0", mkstream=True)
    await raw.xadd(calls, {"id": "c1"})
    await raw.xadd(served, {"id": "s1"})
    await raw.xreadgroup("g", "worker", {served: ">"})  # (a consumer, the call pending)
    await raw.xack(served, "g", (await raw.xrange(served))[0][0])
    await raw.xtrim(served, maxlen=0)  # (served and deleted: empty, its consumer stays)
    await raw.set(other, "a string")
    assert await drop(conn, empty) == 3 and await raw.exists(empty) == 0
    assert await drop(conn, empty) == 0  # (gone: nothing to do)
    assert await drop(conn, calls) == 1 and await raw.xlen(calls) == 1
    assert await drop(conn, served) == 2 and await raw.exists(served) == 1
    assert await drop(conn, other) == -1 and await raw.get(other) == b"a string"
