"""msgpack bodies over the raw bus protocol (docs/bus-protocol.md, "msgpack bodies"): a call
with `fmt msgpack` sends its body in msgpack and gets its reply document in msgpack; inside
it is the same call as its JSON twin (the same stored JSON, the same record: a retry in the
other format is the same call)."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.settings import Settings
from tests.integration.busproto import receive, send
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def packed_call(raw: aredis.Redis, prefix: str, fn: str, body: Any, *,
                      call_id: str | None = None, fmt: bytes = b"msgpack") -> Any:
    """One call whose body is msgpack (`body` packed here unless bytes); its reply as sent."""
    data = body if isinstance(body, bytes) else msgspec.msgpack.encode(body)
    _, reply = await send(raw, prefix, fn, data, call_id=call_id, fmt=fmt)
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None, f"no reply on {reply}"
    return popped[1]


async def test_a_msgpack_call_is_the_json_call_of_the_same_value(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    value = {"n": 1, "f": 2.5, "s": "é", "l": [True, None, -7], "m": {"k": []}}
    reply = await packed_call(raw, prefix, "state::set", {"scope": scope, "key": "k",
                                                          "value": value}, call_id="m1")
    document = msgspec.msgpack.decode(reply)
    assert document["id"] == "m1" and document["ok"] is True
    assert document["result"]["new_value"] == value and document["result"]["version"] == 1
    # the stored JSON is what a JSON caller would have written
    _, json_reply = await send(raw, prefix, "state::get", {"scope": scope, "key": "k"})
    assert (await receive(raw, json_reply))["result"] == value
    got = msgspec.msgpack.decode(await packed_call(raw, prefix, "state::get",
                                                   {"scope": scope, "key": "k"}))
    assert got["result"] == value  # (a get answered in msgpack: not by the JSON-writing script)
    # a msgpack timestamp is a datetime: stored as its RFC 3339 text
    when = datetime.datetime(2026, 12, 3, 18, 0, tzinfo=datetime.UTC)
    await packed_call(raw, prefix, "state::set", {"scope": scope, "key": "t", "value": when})
    _, json_reply = await send(raw, prefix, "state::get", {"scope": scope, "key": "t"})
    assert (await receive(raw, json_reply))["result"] == "2026-12-03T18:00:00Z"


async def test_a_retry_in_the_other_format_is_the_same_call(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    body = {"scope": scope, "key": "once", "value": {"a": [1, 2]}}
    _, first = await send(raw, prefix, "state::set", body, call_id="same")
    applied = await receive(raw, first)
    again = msgspec.msgpack.decode(await packed_call(raw, prefix, "state::set", body,
                                                     call_id="same"))
    assert again == applied and again["result"]["version"] == 1  # its record, not a second run
    other = msgspec.msgpack.decode(await packed_call(raw, prefix, "state::set",
                                                     {**body, "value": 3}, call_id="same"))
    assert other["error"]["code"] == "CALL_ID_REUSED"


async def test_what_msgpack_holds_and_json_does_not_is_refused(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    deep: list[Any] = []
    for _ in range(600):
        deep = [deep]
    cases: list[tuple[bytes, str]] = [
        (msgspec.msgpack.encode({"scope": scope, "key": "k", "value": b"\x00\x01"}),
         "body.value: a binary has no JSON form"),
        (msgspec.msgpack.encode({"scope": scope, "key": "k", "value": {1: "x"}}),
         "body.value: a map key is int"),
        (msgspec.msgpack.encode({"scope": scope, "key": "k", "value": [float("nan")]}),
         "body.value[0]: nan has no JSON form"),
        (msgspec.msgpack.encode({"scope": scope, "key": "k", "value": msgspec.msgpack.Ext(
            5, b"x")}), "body.value: an extension value has no JSON form"),
        (b"\xc1", "body: not valid msgpack"),
        (msgspec.msgpack.encode({"scope": scope, "key": "k", "value": deep}),
         "body: nested more than 512 levels deep (the limit is 512)"),
        # (deeper than the decoder goes: the same limit named, not a recursion error)
        (b"\x91" * 100_000 + b"\xc0", "body: nested more than 512 levels deep (the limit is 512)"),
    ]
    for body, message in cases:
        document = msgspec.msgpack.decode(await packed_call(raw, prefix, "state::set", body))
        assert document["ok"] is False and document["error"]["code"] == "INVALID_REQUEST"
        assert document["error"]["message"].startswith(message), document
        assert document["error"]["details"]["path"] == "body"
    # nothing was written
    _, reply = await send(raw, prefix, "state::get", {"scope": scope, "key": "k"})
    assert (await receive(raw, reply))["result"] is None
    # an entry refused before its body is read answers in msgpack too (no id: the id's error)
    reply = f"{prefix}:reply:{uuid.uuid4().hex}"
    await raw.xadd(f"{prefix}:bus:state", {"fn": "state::get", "body": b"\x80", "reply": reply,
                                           "fmt": "msgpack"})
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None
    assert msgspec.msgpack.decode(popped[1])["error"]["details"] == {"path": "id"}


async def test_an_unknown_format_is_refused_in_json(service: StateService, raw: aredis.Redis,
                                                   prefix: str, scope: str) -> None:
    call_id, reply = await send(raw, prefix, "state::get", {"scope": scope, "key": "k"},
                                fmt="cbor")
    document = await receive(raw, reply)
    assert document["id"] == call_id and document["error"]["code"] == "INVALID_REQUEST"
    assert document["error"]["details"] == {"path": "fmt", "allowed": ["json", "msgpack"]}
    assert document["error"]["message"] == 'fmt: must be json or msgpack, got "cbor"'


async def test_a_reply_number_beyond_64_bits_comes_as_its_text(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    wide = 2 ** 70
    _, reply = await send(raw, prefix, "state::set", f'{{"scope":"{scope}","key":"w",'
                          f'"value":{{"n":{wide},"m":-5}}}}')
    assert (await receive(raw, reply))["ok"] is True
    got = msgspec.msgpack.decode(await packed_call(raw, prefix, "state::get",
                                                   {"scope": scope, "key": "w"},
                                                   call_id=uuid.uuid4().hex))
    assert got["result"] == {"n": str(wide), "m": -5}


async def test_a_reply_number_beyond_a_double_comes_as_its_text(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """A value keeps 1e999999 exactly (JSON); its msgpack reply holds the number's text (no
    double holds it), and the service goes on serving (it used to die writing that reply)."""
    _, reply = await send(raw, prefix, "state::set", f'{{"scope":"{scope}","key":"huge",'
                          '"value":{"big":1e999999,"small":-1E-999999,"f":2.5}}')
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None and b'"ok":true' in popped[1]
    got = msgspec.msgpack.decode(await packed_call(raw, prefix, "state::get",
                                                   {"scope": scope, "key": "huge"},
                                                   call_id=uuid.uuid4().hex))
    assert got["ok"] is True and got["result"] == {"big": "1e999999", "small": -0.0, "f": 2.5}
    _, after = await send(raw, prefix, "state::get", {"scope": scope, "key": "other"})
    assert (await receive(raw, after))["ok"] is True


async def test_a_workers_msgpack_call(redis_server: RedisServer, raw: aredis.Redis,
                                      prefix: str) -> None:
    """A user worker sees the JSON body; its caller gets msgpack, and a retry in JSON gets
    the recorded reply in JSON (a worker's record keeps the JSON document)."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    worker = Worker("mp", settings=settings, options=BusOptions(block_ms=50))
    runs: list[bytes] = []

    @worker.function("mp::echo")
    async def echo(body: Any, call: Call) -> Any:
        runs.append(call.body)
        return {"got": body}

    async def call(fmt: bytes, body: bytes) -> bytes:
        reply = f"{prefix}:reply:{uuid.uuid4().hex}"
        await raw.xadd(f"{prefix}:bus:mp", {"id": "w1", "fn": "mp::echo", "body": body,
                                           "reply": reply, "fmt": fmt})
        popped = await raw.blpop([reply], timeout=10)
        assert popped is not None
        return bytes(popped[1])

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        packed = await call(b"msgpack", msgspec.msgpack.encode({"a": [1, "x"]}))
        again = await call(b"json", b'{"a":[1,"x"]}')
        worker.stop()
    assert runs == [b'{"a":[1,"x"]}']  # run once, with the JSON text of the msgpack body
    assert msgspec.msgpack.decode(packed) == {"id": "w1", "ok": True,
                                              "result": {"got": {"a": [1, "x"]}}}
    assert again == b'{"id":"w1","ok":true,"result":{"got":{"a":[1,"x"]}}}'
