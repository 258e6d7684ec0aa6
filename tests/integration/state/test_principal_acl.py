"""A principal's Redis ACL user (state/principals.acl_rule) on a real redis-server: what a
client of the bus sends is allowed (Redis's ACL LOG stays empty while a StateClient calls
under it), and everything else is NOPERM: another principal's stream, the shared stream,
another's replies, its own stream read or deleted, state keys, the registry, SCAN, KEYS."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest
import redis

from stateworker.bus.client import StateClient
from stateworker.keys import KeySpace, bus_stream, principal_reply_prefix, principal_stream
from stateworker.state import lifecycle
from stateworker.state.tenancy import principals
from stateworker.transport.connection import RedisConnection
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def name() -> str:
    return f"p{uuid.uuid4().hex[:10]}"


async def make_user(server: RedisServer, prefix: str, who: str, password: str) -> None:
    async with lifecycle.open_state(settings=settings_for(server, prefix),
                                    reaper=False) as state:
        await principals.set_user(state, who, password)


def as_user(server: RedisServer, who: str, password: str) -> redis.Redis:
    return redis.Redis(port=server.port, username=who, password=password)


def noperm(call: Callable[[], Any]) -> str:
    with pytest.raises(redis.exceptions.NoPermissionError) as raised:
        call()
    return str(raised.value)


def refused_for(client: redis.Redis, who: str) -> list[tuple[str, str]]:
    """What Redis's ACL LOG holds of `who`: (reason, object) per refusal."""
    return [(str(e["reason"]), str(e["object"])) for e in client.acl_log()
            if e["username"] == who]


async def test_a_principal_may_only_xadd_its_own_stream_and_use_its_own_replies(
        redis_server: RedisServer, prefix: str) -> None:
    me, other = name(), name()
    await make_user(redis_server, prefix, me, "pw-me")
    await make_user(redis_server, prefix, other, "pw-other")
    admin = redis_server.client()
    keys = KeySpace(prefix, 4)
    mine, theirs = principal_stream(prefix, "state", me), principal_stream(prefix, "state", other)
    my_reply = principal_reply_prefix(prefix, me) + "c1"
    their_reply = principal_reply_prefix(prefix, other) + "c1"
    entry = {"id": "c-1", "fn": "state::get", "body": "{}", "reply": my_reply}
    with as_user(redis_server, me, "pw-me") as conn:
        assert conn.ping()
        assert conn.xadd(mine, entry)
        admin.lpush(my_reply, b"r1", b"r2")
        assert conn.lpop(my_reply) == b"r2"
        assert conn.blmpop(1, 1, my_reply, direction="LEFT", count=10) == [
            my_reply.encode(), [b"r1"]]
        admin.lpush(my_reply, b"r3")
        assert conn.pexpire(my_reply, 60_000) and conn.delete(my_reply) == 1
        assert conn.client_setname("me") and conn.client_id()
        admin.lpush(their_reply, b"theirs")
        refusals = {
            "xadd another principal's stream": lambda: conn.xadd(theirs, entry),
            "xadd the shared stream": lambda: conn.xadd(bus_stream(prefix, "state"), entry),
            "xadd a stream to another service": lambda: conn.xadd(
                principal_stream(prefix, "orders", me), entry),  # (one nobody reads)
            "read another's replies": lambda: conn.lpop(their_reply),
            "pop another's replies": lambda: conn.blmpop(1, 1, their_reply, direction="LEFT"),
            "delete another's replies": lambda: conn.delete(their_reply),
            "read its own stream": lambda: conn.xrange(mine),
            "read its own stream in a group": lambda: conn.xreadgroup("state", "x", {mine: ">"}),
            "delete its own stream": lambda: conn.delete(mine),
            "trim its own stream": lambda: conn.xtrim(mine, maxlen=0),
            "push to its own replies": lambda: conn.lpush(my_reply, b"forged"),
            "scan": lambda: conn.scan(0),
            "keys": lambda: conn.keys("*"),
            "read the registry": lambda: conn.xrange(keys.registry),
            "read the principals": lambda: conn.hgetall(keys.principals),
            "read a state key": lambda: conn.get(keys.meta),
            "publish": lambda: conn.publish("x", "y"),
            "an FCALL": lambda: conn.execute_command("FCALL", "x", 0),
            "another user's ACL": lambda: conn.execute_command("ACL", "SETUSER", other, "on"),
        }
        allowed = []
        for what, call in refusals.items():
            try:
                call()
                allowed.append(what)
            except redis.exceptions.NoPermissionError:  # Redis's NOPERM
                pass
        assert allowed == []
    assert admin.lrange(their_reply, 0, -1) == [b"theirs"]
    assert not admin.exists(theirs)
    assert not admin.exists(bus_stream(prefix, "state"))
    assert admin.xlen(mine) == 1


async def test_a_state_client_calls_under_the_rule_with_nothing_refused(
        redis_server: RedisServer, prefix: str) -> None:
    """Run the bus client under a principal's user, to see what it sends: connect (AUTH),
    the readiness PING, XADD, BLMPOP, and DEL of its reply list at close; a stand-in for the
    service answers as the operator. Redis logs no refusal of that user."""
    me = name()
    await make_user(redis_server, prefix, me, "pw")
    admin = redis_server.client()
    admin.acl_log_reset()
    url = f"redis://{me}:pw@127.0.0.1:{redis_server.port}/0"
    stream = principal_stream(prefix, "state", me)
    async with StateClient(settings=settings_for(url, prefix, auth="acl"), timeout=10) as client:
        assert client.stream == stream  # acl mode's names, from the URL's user
        assert client.reply_key.startswith(principal_reply_prefix(prefix, me))

        async def answer() -> None:
            conn = RedisConnection(redis_server.url)
            try:  # (the call's entry, waited for with a blocking read)
                ((_, entries),) = await conn.execute("XREAD", "BLOCK", 10_000, "STREAMS",
                                                     stream, "0-0")
                fields = dict(zip(entries[0][1][::2], entries[0][1][1::2], strict=True))
                document = {"id": fields[b"id"].decode(), "ok": True, "result": {"n": 1}}
                await conn.execute("LPUSH", fields[b"reply"], msgspec.json.encode(document))
            finally:
                await conn.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer)
            assert msgspec.json.decode(await client.call_json("state::get", b"{}")) == {"n": 1}
    assert refused_for(admin, me) == []
    # ... and the log does catch a refusal of that user (so the empty log means something).
    with as_user(redis_server, me, "pw") as conn:
        noperm(lambda: conn.xadd(bus_stream(prefix, "state"), {"a": "b"}))
    assert refused_for(admin, me) == [("key", bus_stream(prefix, "state"))]
