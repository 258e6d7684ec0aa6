"""sweep.lua (a bus runtime's sweep of dead consumers, bus/upkeep.py): of a group's consumers it
removes exactly those with nothing pending idle past the bound, never the sweeper's own; a
stream or group that is not there is nothing to sweep; a user that may not remove a consumer
gets Redis's NOPERM and nothing is removed. The bound is an argument: idle 0 ms is past a bound
of 0, so no test waits for time to pass."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from stateworker.bus.sources import Sources, swept_consumers
from stateworker.keys import bus_stream
from stateworker.scripts.replies import Swept
from stateworker.scripts.upkeep_bindings import bus_library
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ReplyError
from tests.integration.acl_users import add_user
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

GROUP = "svc"


async def sweep(conn: RedisConnection, stream: str, idle_ms: int, me: str = "me"
                ) -> Swept | ReplyError:
    (result,) = await swept_consumers(conn, bus_library(conn), Sources("p", GROUP, stream),
                                      GROUP, me, idle_ms)
    return result


async def consumers(raw: aredis.Redis, stream: str) -> dict[str, int]:
    """The group's consumers: name -> entries pending."""
    return {c["name"].decode(): c["pending"] for c in await raw.xinfo_consumers(stream, GROUP)}


async def past_zero(raw: aredis.Redis, stream: str) -> bool:
    """Every consumer idle 1 ms at least (`idle` is whole ms): past a bound of 0."""
    return all(c["idle"] > 0 for c in await raw.xinfo_consumers(stream, GROUP))


@pytest.fixture
async def conn(redis_server: RedisServer) -> AsyncIterator[RedisConnection]:
    opened = connection_for(redis_server.url)
    yield opened
    await opened.close()


async def test_only_idle_consumers_with_nothing_pending_go_never_the_sweepers_own(
        conn: RedisConnection, raw: aredis.Redis, prefix: str) -> None:
    stream = bus_stream(prefix, GROUP)
    await raw.xgroup_create(stream, GROUP, id="0", mkstream=True)
    for n in range(4):
        await raw.xadd(stream, {"n": n})
    # "busy" holds an entry pending; "done" and "me" (the sweeper) acknowledged theirs.
    (_, [(busy, _)]), = await raw.xreadgroup(GROUP, "busy", {stream: ">"}, count=1)
    for name in ("done", "me", "done-too"):
        (_, [(entry, _)]), = await raw.xreadgroup(GROUP, name, {stream: ">"}, count=1)
        await raw.xack(stream, GROUP, entry)
    assert await consumers(raw, stream) == {"busy": 1, "done": 0, "me": 0, "done-too": 0}
    # None is idle past 10 minutes: nothing goes.
    assert await sweep(conn, stream, 600_000) == Swept(0, 4)
    await until(lambda: past_zero(raw, stream), 10, "every consumer idle 1 ms")
    assert await sweep(conn, stream, 0) == Swept(2, 2)
    assert await consumers(raw, stream) == {"busy": 1, "me": 0}
    # The entry "busy" holds is still its own, and is taken over as before.
    claimed = await raw.xautoclaim(stream, GROUP, "heir", 0, "0-0")
    assert [entry for entry, _ in claimed[1]] == [busy]
    await raw.xack(stream, GROUP, busy)
    await until(lambda: past_zero(raw, stream), 10, "every consumer idle 1 ms")
    assert await sweep(conn, stream, 0, me="heir") == Swept(2, 1)
    assert await consumers(raw, stream) == {"heir": 0}


async def test_no_stream_or_group_is_nothing_to_sweep(
        conn: RedisConnection, raw: aredis.Redis, prefix: str) -> None:
    stream = bus_stream(prefix, GROUP)
    assert await sweep(conn, stream, 0) == Swept(0, 0)  # no stream
    await raw.xgroup_create(stream, "another", id="0", mkstream=True)
    assert await sweep(conn, stream, 0) == Swept(0, 0)  # no such group
    await raw.delete(stream)
    await raw.set(stream, "a string")  # another type: Redis's error, not nothing
    refused = await sweep(conn, stream, 0)
    assert isinstance(refused, ReplyError) and str(refused).startswith("WRONGTYPE")


async def test_a_user_that_may_not_remove_a_consumer_gets_noperm_and_nothing_goes(
        acl_redis: RedisServer, prefix: str) -> None:
    """On a server of the module's own (ACL users are the server's), with no library loaded
    yet: the sweep loads it, then its XGROUP DELCONSUMER is refused."""
    stream = bus_stream(prefix, GROUP)
    url = add_user(acl_redis, "no-delconsumer", ["on", "~*", "+@all", "-xgroup|delconsumer"])
    admin = aredis.Redis(port=acl_redis.port)
    conn = connection_for(url)
    try:
        await admin.xgroup_create(stream, GROUP, id="0", mkstream=True)
        await admin.xadd(stream, {"n": 1})
        (_, [(entry, _)]), = await admin.xreadgroup(GROUP, "dead", {stream: ">"}, count=1)
        await admin.xack(stream, GROUP, entry)
        await until(lambda: past_zero(admin, stream), 10, "the consumer idle 1 ms")
        refused = await sweep(conn, stream, 0)
        # (Redis 7.0 words a script's refused command so, naming none; 7.2+ says NOPERM and it)
        assert isinstance(refused, ReplyError) and (
            "can't run this command or subcommand" in str(refused)
            or ("NOPERM" in str(refused) and "xgroup|delconsumer" in str(refused))), refused
        assert await consumers(admin, stream) == {"dead": 0}
    finally:
        await conn.close()
        await admin.aclose()
