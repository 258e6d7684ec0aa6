"""What a hostile or careless caller can do, and what it gets: reply keys the service does not
own, a call id reused across partitions, an oversized context, Redis out of memory, values
beyond the decoder's limits (issue: safe in front of any caller)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateClient, StateError, StateStore
from stateworker.app.service import StateService
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import receive, roundtrip, send, until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def acknowledged(raw: aredis.Redis, prefix: str, entry_id: bytes) -> bool:
    """The state service has read and acknowledged this entry of its stream."""
    stream = f"{prefix}:bus:state"
    groups = await raw.xinfo_groups(stream)
    if not groups or groups[0]["last-delivered-id"] < entry_id:
        return False
    return not await raw.xpending_range(stream, "state", min=entry_id, max=entry_id, count=1)


async def test_replies_go_only_to_reply_lists_of_the_prefix(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    foreign_string, foreign_list = f"app:{uuid.uuid4().hex}", f"app:{uuid.uuid4().hex}"
    own_key = f"{prefix}:stats:state"  # under the prefix, but not a reply list
    await raw.set(foreign_string, "mine")
    await raw.rpush(foreign_list, "a")
    stream = f"{prefix}:bus:state"
    entries = []
    for n, reply in enumerate((foreign_string, foreign_list, own_key, f"{prefix}:reply:")):
        body = msgspec.json.encode({"scope": scope, "key": f"k{n}", "value": n})
        entries.append(await raw.xadd(stream, {"id": f"bad-{n}", "fn": "state::set",
                                               "body": body, "reply": reply}))
    await until(lambda: acknowledged(raw, prefix, entries[-1]), 10, "the entries acknowledged")
    assert await raw.get(foreign_string) == b"mine" and await raw.ttl(foreign_string) == -1
    assert await raw.lrange(foreign_list, 0, -1) == [b"a"] and await raw.ttl(foreign_list) == -1
    assert await raw.type(own_key) in (b"hash", b"none")
    for n in range(4):  # none of the calls ran
        document = await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": f"k{n}"})
        assert document["result"] is None

    async def counted() -> bool:
        return await raw.hget(f"{prefix}:stats:state", "reply_refused") == b"4"

    await until(counted, 10, "reply_refused counted")


def two_scopes_in_two_partitions(prefix: str) -> tuple[str, str]:
    keys = KeySpace(prefix, 4)
    first = "acct-a"
    second = next(f"acct-{n}" for n in range(100)
                  if keys.partition_of(f"acct-{n}") != keys.partition_of(first))
    return first, second


async def test_a_call_id_is_bound_to_its_first_call_across_partitions(
        service: StateService, raw: aredis.Redis, prefix: str) -> None:
    a, b = two_scopes_in_two_partitions(prefix)
    increment = [{"type": "increment", "path": "", "by": 1}]
    first = await roundtrip(raw, prefix, "state::update", {"scope": a, "key": "bal",
                                                           "ops": increment}, call_id="pay-1")
    assert first["ok"] is True
    other = await roundtrip(raw, prefix, "state::update", {"scope": b, "key": "bal",
                                                           "ops": increment}, call_id="pay-1")
    assert other["ok"] is False and other["error"]["code"] == "CALL_ID_REUSED"
    assert "pay-1" in other["error"]["message"]
    read = await roundtrip(raw, prefix, "state::get", {"scope": b, "key": "bal"},
                           call_id="pay-1")
    assert read["error"]["code"] == "CALL_ID_REUSED"
    again = await roundtrip(raw, prefix, "state::update", {"scope": a, "key": "bal",
                                                           "ops": increment}, call_id="pay-1")
    assert again == first  # the first call's retry: its recorded reply
    assert (await roundtrip(raw, prefix, "state::get", {"scope": a, "key": "bal"}))["result"] == 1
    assert (await roundtrip(raw, prefix, "state::get", {"scope": b, "key": "bal"}))["result"] \
        is None
    # A read's retry with the same id is the same call.
    body = {"scope": a, "key": "bal"}
    assert (await roundtrip(raw, prefix, "state::get", body, call_id="r-1"))["result"] == 1
    assert (await roundtrip(raw, prefix, "state::get", body, call_id="r-1"))["result"] == 1


async def test_concurrent_reuse_of_one_id_in_many_partitions_applies_once(
        service: StateService, raw: aredis.Redis, prefix: str) -> None:
    scopes = [f"race-{n}" for n in range(16)]
    sent = [await send(raw, prefix, "state::set", {"scope": s, "key": "k", "value": 1},
                       call_id="same-id") for s in scopes]
    documents = [await receive(raw, reply) for _, reply in sent]
    assert sum(d["ok"] for d in documents) == 1
    assert {d["error"]["code"] for d in documents if not d["ok"]} == {"CALL_ID_REUSED"}
    written = [(await roundtrip(raw, prefix, "state::get", {"scope": s, "key": "k"}))["result"]
               for s in scopes]
    assert written.count(1) == 1 and written.count(None) == 15


async def test_context_is_bounded(service: StateService, raw: aredis.Redis, prefix: str,
                                  scope: str) -> None:
    body = {"scope": scope, "key": "k", "value": 1}
    big = msgspec.json.encode({"user_id": "u", "note": "x" * (64 * 1024)})
    document = await roundtrip(raw, prefix, "state::set", body, context=big)
    error = document["error"]
    assert error["code"] == "VALUE_TOO_LARGE"
    assert error["details"] == {"field": "context", "size": len(big), "limit": 64 * 1024}
    assert "65536" in error["message"]
    assert (await roundtrip(raw, prefix, "state::get", body))["result"] is None
    fits = msgspec.json.encode({"user_id": "u", "note": "x" * 60_000})
    assert (await roundtrip(raw, prefix, "state::set", body, context=fits))["ok"] is True


@pytest.fixture
async def small_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A server of its own: the test sets maxmemory."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


async def test_out_of_memory_is_resource_exhausted(small_redis: RedisServer) -> None:
    async with StateStore.open(small_redis.url, prefix="oom", partitions=2,
                               reaper=False) as store:
        admin = aredis.Redis(port=small_redis.port)
        used = int((await admin.info("memory"))["used_memory"])
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", str(used + 2 * 1024 * 1024))
        value = "x" * 64 * 1024
        with pytest.raises(StateError) as caught:
            for n in range(200):
                await store.set("s", f"k{n}", value)
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        assert "maxmemory" in caught.value.message and "nothing was written" in \
            caught.value.message
        assert 0 < n < 200
        assert await store.get("s", f"k{n}") is None  # refused before the script ran
        assert await store.get("s", "k0") == value  # reads still work
        with pytest.raises(StateError) as caught:
            await store.call("state::update", {"scope": "s", "key": "k0", "ops": [
                {"type": "set", "path": "", "value": "y"}]})
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        # A caller on the bus meets it when it sends: its XADD is refused.
        async with StateClient(settings=Settings(redis_url=small_redis.url, prefix="oom"),
                               timeout=5) as client:
            with pytest.raises(StateError) as caught:
                await client.set("s", "by-bus", 1)
            assert caught.value.code == "RESOURCE_EXHAUSTED"
            assert "maxmemory" in caught.value.message
        await admin.config_set("maxmemory", "0")  # memory back: writes go on
        await store.set("s", f"k{n}", value)
        assert await store.get("s", f"k{n}") == value
        await admin.aclose()


async def test_limits_are_named(store: StateStore, scope: str) -> None:
    deep = "[" * 600 + "]" * 600
    with pytest.raises(StateError) as caught:
        await store.call_json("state::set", f'{{"scope":"{scope}","key":"k","value":{deep}}}')
    assert caught.value.code == "INVALID_REQUEST"
    assert "512" in caught.value.message and caught.value.details["limit"] == 512
    long_int = "9" * 4301
    with pytest.raises(StateError) as caught:
        await store.call_json("state::set",
                              f'{{"scope":"{scope}","key":"k","value":[{long_int}]}}')
    assert "4300" in caught.value.message and caught.value.details["limit"] == 4300
    fits = "[" * 512 + "]" * 512
    await store.call_json("state::set", f'{{"scope":"{scope}","key":"k","value":{fits}}}')
    assert (await store.call("state::get", {"scope": scope, "key": "k"})) is not None
    await store.call_json("state::set",
                          f'{{"scope":"{scope}","key":"n","value":{"9" * 4300}}}')
    assert await store.call_json("state::get", f'{{"scope":"{scope}","key":"n"}}') == b"9" * 4300


async def test_create_only_conflict_names_create_only(store: StateStore, scope: str) -> None:
    await store.set(scope, "k", 1)
    await store.set(scope, "k", 2)
    with pytest.raises(StateError) as caught:
        await store.set(scope, "k", 3, create_only=True)
    assert caught.value.code == "CONFLICT"
    assert caught.value.message.startswith("create_only: key 'k'")
    assert "already exists (version 2)" in caught.value.message
    assert "expected_version" not in caught.value.message
