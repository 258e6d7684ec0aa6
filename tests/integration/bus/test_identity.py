"""What a call id is bound to, what a value keeps and what it loses, and who makes a trigger
target's consumer group (docs/bus-protocol.md): over the raw protocol, as a program in any
language speaks it."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from tests.integration.busproto import receive, roundtrip, until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def raw_call(raw: aredis.Redis, prefix: str, fn: str, body: bytes, call_id: str,
                   service: str = "state") -> dict[str, Any]:
    """One call with `body` sent as these exact bytes; its reply document."""
    reply = f"{prefix}:reply:{uuid.uuid4().hex}"
    await raw.xadd(f"{prefix}:bus:{service}",
                   {"id": call_id, "fn": fn, "body": body, "reply": reply})
    return await receive(raw, reply)


# ---- identity of a retry: the canonical form of the body --------------------------------------
async def test_a_retry_serialized_differently_is_the_same_call(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """Spacing, key order, escapes and a duplicate key's earlier value do not make another
    call: the retry gets the first reply and the increment is applied once. Another value is
    another call (CALL_ID_REUSED)."""
    first_text = (b'{"scope":"%s","key":"k","ops":[{"type":"increment","path":"n","by":1}],'
                  b'"topic":"caf\xc3\xa9"}' % scope.encode())
    again_texts = [
        b'{ "scope" : "%s" , "key" : "k" , "ops" : [ { "type" : "increment" , "path" : "n" ,'
        b' "by" : 1 } ] , "topic" : "caf\\u00e9" }' % scope.encode(),
        b'{"topic":"caf\xc3\xa9","ops":[{"by":1,"path":"n","type":"increment"}],"key":"k",'
        b'"scope":"%s"}' % scope.encode(),
        b'{"scope":"%s","key":"k","key":"k","ops":[{"type":"increment","path":"\\u006e",'
        b'"by":1}],"topic":"caf\xc3\xa9"}' % scope.encode(),
    ]
    first = await raw_call(raw, prefix, "state::update", first_text, "retry-1")
    assert first["ok"] is True and first["result"]["new_value"] == {"n": 1}, first
    for text in again_texts:
        assert await raw_call(raw, prefix, "state::update", text, "retry-1") == first
    other = await raw_call(raw, prefix, "state::update", first_text.replace(b'"by":1', b'"by":2'),
                           "retry-1")
    assert other["ok"] is False and other["error"]["code"] == "CALL_ID_REUSED", other
    get = await roundtrip(raw, prefix, "state::get-entry", {"scope": scope, "key": "k"})
    assert (get["result"]["value"], get["result"]["version"]) == ({"n": 1}, 1)
    # A read binds its id the same way (bind.lua): reordered, it is the same call.
    text = b'{"scope":"%s","key":"k"}' % scope.encode()
    assert (await raw_call(raw, prefix, "state::get", text, "read-1"))["ok"] is True
    reordered = b'{"key":"k", "scope":"%s"}' % scope.encode()
    assert (await raw_call(raw, prefix, "state::get", reordered, "read-1"))["ok"] is True


async def test_a_user_worker_binds_an_id_to_the_canonical_body(redis_server: RedisServer,
                                                                prefix: str) -> None:
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    runs: list[Any] = []

    @worker.function("orders::create")
    async def create(body: Any, call: Call) -> Any:
        runs.append(body)
        return {"created": body["n"]}

    raw = aredis.Redis(port=redis_server.port)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            first = await raw_call(raw, prefix, "orders::create", b'{"n":1,"m":"\xc3\xa9"}',
                                   "o-1", "orders")
            again = await raw_call(raw, prefix, "orders::create",
                                   b'{ "m": "\\u00e9", "n": 1 }', "o-1", "orders")
            other = await raw_call(raw, prefix, "orders::create", b'{"n":2,"m":"\xc3\xa9"}',
                                   "o-1", "orders")
            worker.stop()
    finally:
        await raw.aclose()
    assert first["ok"] is True and again == first
    assert other["error"]["code"] == "CALL_ID_REUSED"
    assert runs == [{"n": 1, "m": "é"}]


# ---- values: exact, normalized, refused ---------------------------------------------------------
async def test_values_keep_numbers_and_order_and_normalize_text(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """As docs/bus-protocol.md's "Values" says, byte for byte."""
    value = (b'{"n":9007199254740993,"d":1.2300,"e":1E2,"a":[ ],"o":{ },"z":1,"b":2,'
             b'"esc":"\\u00e9\\n\\/\\u0001<\\ud83d\\ude00","dup":1,"x":0,"dup":2,"neg":-0}')
    body = b'{"scope":"%s","key":"v","value":%s}' % (scope.encode(), value)
    assert (await raw_call(raw, prefix, "state::set", body, uuid.uuid4().hex))["ok"] is True
    reply = f"{prefix}:reply:{uuid.uuid4().hex}"
    await raw.xadd(f"{prefix}:bus:state", {"id": uuid.uuid4().hex, "fn": "state::get",
                                           "body": b'{"scope":"%s","key":"v"}' % scope.encode(),
                                           "reply": reply})
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None
    document: bytes = popped[1]
    # The result is the document's last member, its JSON as stored.
    head, _, result = document.partition(b',"ok":true,"result":')
    assert head.startswith(b'{"id":') and result.endswith(b"}")
    assert result[:-1] == (
        b'{"n":9007199254740993,"d":1.2300,"e":1E2,"a":[],"o":{},"z":1,"b":2,'
        b'"esc":"\xc3\xa9\\n/\\u0001<\xf0\x9f\x98\x80","dup":2,"x":0,"neg":-0}')


# Objects shaped as the Python API's tags whose `$value` is no such value, as any caller may
# store them: each is the value it is for every Python reader and Worker.
NOT_TAGS = [{"$type": "decimal", "$value": "x"}, {"$type": "datetime", "$value": "garbage"},
            {"$type": "date", "$value": "2020-13-45"}, {"$type": "time", "$value": "25:00"},
            {"$type": "uuid", "$value": "u"}, {"$type": "bytes", "$value": "!!!"}]


async def test_a_tag_holding_no_such_value_is_read_as_the_object_it_is(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """One caller's value must not make a scope unreadable to every Python client, nor keep
    a Worker's function from being called: `get` and `list` raised the parser's own
    exception (decimal.InvalidOperation, ValueError: no error code), and a Worker answered
    INTERNAL or called the body no JSON."""
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("echo", settings=settings, options=BusOptions(block_ms=50))
    handed: list[Any] = []

    @worker.function("echo::it")
    async def it(body: Any, call: Call) -> Any:
        handed.append(body)
        return body

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=10) as reader, \
            anyio.create_task_group() as tg:
        await tg.start(worker.run)
        for n, value in enumerate(NOT_TAGS):
            body = msgspec.json.encode({"scope": scope, "key": f"k{n}", "value": value})
            assert (await raw_call(raw, prefix, "state::set", body, uuid.uuid4().hex))["ok"]
            assert await reader.get(scope, f"k{n}") == value
        assert await reader.list(scope) == NOT_TAGS
        document = await raw_call(raw, prefix, "echo::it", msgspec.json.encode(NOT_TAGS),
                                  uuid.uuid4().hex, "echo")
        worker.stop()
    assert document == {"id": document["id"], "ok": True, "result": NOT_TAGS}
    assert handed == [NOT_TAGS]


async def test_a_lone_surrogate_is_refused_naming_its_path(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    for value, path, escape in [(b'"\\ud800"', "$.value", "\\ud800"),
                                (b'{"a":[1,"x\\udc00"]}', "$.value.a[1]", "\\udc00"),
                                (b'{"s":"\\ud83d\\ud83d\\ude00"}', "$.value.s", "\\ud83d")]:
        body = b'{"scope":"%s","key":"k","value":%s}' % (scope.encode(), value)
        document = await raw_call(raw, prefix, "state::set", body, uuid.uuid4().hex)
        assert document["ok"] is False, document
        error = document["error"]
        assert error["code"] == "INVALID_REQUEST"
        assert error["details"]["path"] == path and error["details"]["escape"] == escape
        assert error["message"].startswith(f"{path}: holds a lone UTF-16 surrogate `{escape}`")
        assert "truncated" not in error["message"]
    # An escaped backslash before `ud800` is no escape: the text `\ud800` is stored.
    body = b'{"scope":"%s","key":"k","value":"\\\\ud800"}' % scope.encode()
    assert (await raw_call(raw, prefix, "state::set", body, uuid.uuid4().hex))["ok"] is True
    got = await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": "k"})
    assert got["result"] == "\\ud800"


async def test_a_user_worker_refuses_a_lone_surrogate_naming_its_path(
        redis_server: RedisServer, prefix: str) -> None:
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("echo", settings=settings, options=BusOptions(block_ms=50))

    @worker.function("echo::it")
    async def it(body: Any, call: Call) -> Any:
        return body

    raw = aredis.Redis(port=redis_server.port)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            document = await raw_call(raw, prefix, "echo::it", b'{"k":["\\udfff"]}',
                                      uuid.uuid4().hex, "echo")
            worker.stop()
    finally:
        await raw.aclose()
    assert document["error"]["code"] == "INVALID_REQUEST"
    assert document["error"]["details"]["path"] == "$.k[0]"


# ---- a trigger's target: its consumer group is made at registration --------------------------
async def test_a_trigger_makes_its_services_group_so_no_waiting_call_is_lost(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """A worker that makes its group at `$` (against the doc's advice) after calls were
    dispatched still reads them: the service made the group at `0` when the trigger named
    the service (and its condition service)."""
    target, judge = f"svc-{uuid.uuid4().hex[:8]}", f"judge-{uuid.uuid4().hex[:8]}"
    registered = await roundtrip(raw, prefix, "state::register-trigger", {
        "id": f"t-{target}", "function_id": f"{target}::on", "service": target,
        "config": {"scope": scope, "condition_function_id": f"{judge}::ok",
                   "condition_service": judge, "condition_timeout_ms": 1}})
    assert registered["ok"] is True, registered
    for name in (target, judge):
        groups = await raw.xinfo_groups(f"{prefix}:bus:{name}")
        assert [(g["name"], g["last-delivered-id"]) for g in groups] == [
            (name.encode(), b"0-0")], name
    await roundtrip(raw, prefix, "state::unregister-trigger", {"id": f"t-{target}"})
    await roundtrip(raw, prefix, "state::register-trigger", {
        "id": f"t-{target}", "function_id": f"{target}::on", "service": target,
        "config": {"scope": scope}})
    await roundtrip(raw, prefix, "state::set", {"scope": scope, "key": "k", "value": 1})
    stream = f"{prefix}:bus:{target}"
    await until(lambda: raw.xlen(stream), 10, "the handler call on the target's stream")
    with pytest.raises(aredis.ResponseError, match="BUSYGROUP"):
        await raw.xgroup_create(stream, target, id="$", mkstream=True)
    read = await raw.xreadgroup(target, "late", {stream: ">"}, count=10)
    assert len(read) == 1 and len(read[0][1]) == 1
    fields = read[0][1][0][1]
    assert fields[b"fn"] == f"{target}::on".encode()
    assert msgspec.json.decode(fields[b"body"])["key"] == "k"
